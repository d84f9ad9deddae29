"""experiments/dgmlp_curve.py's report from real (tiny) runs: every planned point read back,
the table with intervals, the figure, and a clear error when a run is missing."""
import json

import pytest

from configs import mlp_common
from dynjax.data import tabular
from dynjax.train import loop
from experiments import dgmlp_curve as curve



def _set(config, override: str):
    """Apply a ``--config.a.b=value`` override the way train.py's flags would."""
    path, value = override.removeprefix("--config.").split("=")
    *parents, leaf = path.split(".")
    node = config
    for p in parents:
        node = node[p]
    node[leaf] = type(node[leaf])(float(value))


def test_curve_report_from_real_runs(tmp_path):
    try:
        tabular.load("mnist5k")
    except tabular.DataError as e:
        pytest.skip(f"tabular data not fetched: {e}")
    runs = curve.planned_runs([0.5], [0.3])
    for name, method, overrides in runs:
        c = mlp_common.base(method, "mnist5k")
        c.model.hidden = (8, 8)
        c.train.update(steps=2, batch_size=32, warmup_steps=1, eval_every=1000, ckpt_every=2,
                       log_every=1)
        c.eval.batch_size = 500
        for o in overrides:
            _set(c, o)
        loop.train(c, str(tmp_path / "runs" / name), progress=False)
    out = tmp_path / "out" / "curve"
    args = ["--dataset=mnist", "--lambdas=0.5", "--densities=0.3",
            f"--runs={tmp_path / 'runs'}", f"--out={out}", "--plot-only"]
    curve.main(args)
    points = json.loads(out.with_suffix(".json").read_text())["points"]
    assert [p["run"] for p in points] == [name for name, _, _ in runs]
    by_run = {p["run"]: p for p in points}
    assert by_run["dgate_l0.5"]["lambda_g"] == 0.5
    assert by_run["prune_d0.3"]["density"] == 0.3
    assert by_run["rigl"]["density"] == pytest.approx(0.2)       # 1 - sparsity 0.8
    assert by_run["dense"]["relmac"] == 1.0 and by_run["dense"]["examples"] == 500
    md = out.with_suffix(".md").read_text()
    assert "| DynamicGate | λ_g=0.5 |" in md and "95% CI" in md
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit, match=r"no eval.json for \['dgate_l0.1'\]"):
        curve.main([*args[:1], "--lambdas=0.1", *args[2:]])
    with pytest.raises(SystemExit, match="comma-separated numbers"):
        curve.main([*args[:1], "--lambdas=half", *args[2:]])
