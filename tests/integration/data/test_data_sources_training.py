"""train.py's and audit.py's programs on a TFDS classification dataset (the datasets and
their reading: tests/unit/data/test_data_sources.py, whose fixture builds them)."""
import pathlib
import sys

from configs import dgmlp_tfds

# The TFDS builders are imported as pytest imports their file (by its name, from its folder),
# not as tests.unit.data....: TFDS finds a builder's code by its module's top-level package,
# and one module for both files registers each builder once when they share a process.
sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "unit" / "data"))
from test_data_sources import tfds_dir  # noqa: E402,F401 (a fixture)


def test_train_and_audit_a_dynamic_gate_on_a_tfds_dataset(tfds_dir, tmp_path, monkeypatch):
    """train.py's and audit.py's programs on a TFDS dataset with custom feature names."""
    import json

    from configs import audit_tiny
    from dynjax.audit import run
    from dynjax.train.loop import train

    monkeypatch.setenv("DYNJAX_DATA", str(tmp_path / "cache"))
    c = dgmlp_tfds.get_config("dgate,dynjax_custom_keys")
    c.data.update(data_dir=tfds_dir, tfds_input_key="pixels", tfds_label_key="category")
    c.model.hidden = (16, 16)
    c.gate.update(warmup_steps=0, anneal_steps=2, ramp_steps=2)
    c.train.update(steps=4, batch_size=8, warmup_steps=1, eval_every=1000, ckpt_every=4)
    c.eval.batch_size = 16
    result = train(c, str(tmp_path / "run"), progress=False)
    assert result["test"]["examples"] == 12 and 0 <= result["test"]["accuracy"] <= 1
    a = audit_tiny.get_config()
    a.reassignments, a.batch_size, a.stats.n_resamples = 2, 4, 99
    a.data.calib_windows = a.data.eval_windows = 4
    run.audit_from_config(a, [str(tmp_path / "run")], out=str(tmp_path / "audit"),
                          progress=False, log=lambda _: None)
    res = json.loads((tmp_path / "audit" / "results.json").read_text())
    assert res["replay"]["exact"] is True
    assert res["meta"]["windows"]["window_shapes"] == {"x": [8 * 8 * 3], "y": []}
