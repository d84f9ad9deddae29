"""train.py's loop: loss falls on real text, resume is bitwise, metrics, errors, mass match."""
import json

import jax
import numpy as np
import pytest

from dynjax.train import checkpoint, loop
from dynjax.train.metrics import read_jsonl
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """One 6-step feature_gate run, shared by the tests below."""
    run = tmp_path_factory.mktemp("straight")
    result = loop.train(tiny_config("feature_gate"), str(run), progress=False)
    return run, result


def _params(run):
    return checkpoint.load_params(run)[2]


def test_loss_falls_on_real_text(tmp_path):
    c = tiny_config("feature_gate")
    c.train.update(dict(steps=40, log_every=5, ckpt_every=40, warmup_steps=5, lr=1e-2))
    loop.train(c, str(tmp_path), progress=False)
    losses = [r["loss"] for r in read_jsonl(tmp_path / "metrics.jsonl") if "split" not in r]
    assert losses[-1] < losses[0] - 1.0, losses  # from ~ln 256 nats toward byte statistics


def test_resume_equals_uninterrupted(straight_run, tmp_path):
    run, _ = straight_run
    c = tiny_config("feature_gate")
    c.train.steps = 3                                   # stop after the first checkpoint
    loop.train(c, str(tmp_path), progress=False)
    c.train.steps = 6
    resumed = loop.train(c, str(tmp_path), progress=False)
    a, b = _params(run), _params(tmp_path)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    assert resumed["test"]["nll"] == straight_run[1]["test"]["nll"]
    steps = [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl") if "split" not in r]
    # the stopped run logged its last step (3); nothing is duplicated or lost on resume
    assert steps == [2, 3, 4, 6]


def test_run_directory_contents(straight_run):
    run, result = straight_run
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["variant"] == "feature_gate"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["3", "6"]
    ev = json.loads((run / "eval.json").read_text())
    for split in ("validation", "test"):
        assert ev[split]["windows"] == 16
        assert len(ev[split]["gate_mass_per_layer"]) == 3
        assert ev[split]["gate_mass"] == pytest.approx(np.mean(ev[split]["gate_mass_per_layer"]))
        assert ev[split]["bpb"] == pytest.approx(ev[split]["nll"] / np.log(2))
    rec = [r for r in read_jsonl(run / "metrics.jsonl") if "split" not in r][-1]
    assert {"step", "loss", "bpb", "tokens_per_s", "gate_mass_per_layer", "grad_norm"} <= set(rec)
    assert result["test"] == ev["test"]


def test_mass_matched_uniform(straight_run, tmp_path):
    run, result = straight_run
    c = tiny_config("uniform")
    c.mass_match_run = str(run)
    c.train.steps = 2
    out = loop.train(c, str(tmp_path), progress=False)
    target = result["validation"]["gate_mass"]
    assert json.loads((tmp_path / "config.json").read_text())["model"]["uniform_value"] == target
    assert out["test"]["gate_mass"] == pytest.approx(target, rel=1e-6)


def test_bad_configs_give_clear_errors(straight_run, tmp_path):
    c = tiny_config("dense")
    c.mass_match_run = str(tmp_path)
    with pytest.raises(ValueError, match="mass_match_run is only meaningful"):
        loop.train(c, str(tmp_path / "a"), progress=False)
    c = tiny_config("uniform")
    c.mass_match_run = str(tmp_path)
    with pytest.raises(ValueError, match="no eval.json"):
        loop.train(c, str(tmp_path / "b"), progress=False)
    c = tiny_config("feature_gate")
    c.train.steps = 0
    with pytest.raises(ValueError, match="train.steps"):
        loop.train(c, str(tmp_path / "c"), progress=False)
    c = tiny_config("feature_gate", d_model=64)     # resuming with another architecture
    with pytest.raises(ValueError, match="different 'model' config"):
        loop.train(c, str(straight_run[0]), progress=False)


def test_train_cli_overrides(tmp_path):
    """The command line: --config.field overrides and the printed bits per byte."""
    import subprocess
    import sys

    from tests.conftest import ROOT
    cmd = [sys.executable, "train.py", "--config=configs/tiny.py:layer_static",
           f"--workdir={tmp_path}", "--config.train.steps=2", "--config.model.d_model=32",
           "--config.model.n_heads=2", "--config.model.d_ff=64", "--config.model.n_layers=2",
           "--config.data.seq_len=32", "--config.train.batch_size=4",
           "--config.eval.windows=8", "--config.eval.batch_size=8"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "test:" in out.stdout and "bits/byte" in out.stdout
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model"]["variant"] == "layer_static" and config["model"]["d_model"] == 32
    bad = subprocess.run(cmd[:2] + ["--config=configs/tiny.py:sparse", f"--workdir={tmp_path}/x"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "unknown variant 'sparse'" in bad.stderr
    no_data = subprocess.run(cmd + ["--config.data.source=files", "--config.data.path=/absent",
                                    f"--workdir={tmp_path}/y"],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert no_data.returncode != 0 and "Traceback" not in no_data.stderr
    assert "train.py: error: data.path='/absent' does not exist" in no_data.stderr
