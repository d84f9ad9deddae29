"""scripts/fca_sweep.py: the grid's order (cheapest first, whole rows), resumption (finished
runs and audits skipped), and the report from run and audit files of the shape train.py and
audit.py write."""
import importlib.util
import json
import os

import pytest

from tests.conftest import ROOT

_spec = importlib.util.spec_from_file_location(
    "fca_sweep", os.path.join(ROOT, "scripts", "fca_sweep.py"))
sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sweep)


def _finish_run(runs, row, seed, bpb):
    d = sweep.run_dir(runs, row, seed)
    (d / "checkpoints" / str(row["steps"])).mkdir(parents=True)
    (d / "eval.json").write_text(json.dumps({"test": {"bpb": bpb}}))
    (d / "sweep_device.json").write_text(json.dumps({"platform": "cpu", "device_kind": "cpu"}))


def _finish_audit(runs, row, scale):
    """An audit results.json with the fields the report reads (audit.py writes many more)."""
    labels = dict(zip(sweep.CONDITIONS, ("Cross-input", "Token-shuffle", "Cross+shuffle",
                                         "Layer×PositionMean", "LayerMean", "GlobalMean")))
    conds = {c: {"label": labels[c], "estimate": scale * (i + 1), "ci_low": scale * i,
                 "ci_high": scale * (i + 2), "p": 0.25} for i, c in enumerate(sweep.CONDITIONS)}
    conds["static_profile"].update(
        retention={"estimate": 0.9, "ci_low": 0.85, "ci_high": 0.95},
        verdicts={"practically_small": {"met": False}, "high_retention": {"met": False}})
    res = {"conditions": conds, "effects": {}, "replay": {"exact": True, "nll": 1.7},
           "meta": {"checkpoints": [{"name": sweep.run_dir(runs, row, s).name}
                                    for s in sweep.SEEDS], "windows": {"eval": 512}}}
    sweep.audit_dir(runs, row).mkdir(parents=True)
    (sweep.audit_dir(runs, row) / "results.json").write_text(json.dumps(res))


def test_order_resume_and_report(tmp_path):
    rows = sweep.planned_rows()
    assert [sweep.row_name(r) for r in rows[:2]] == ["tiny_feature_gate_400", "tiny_mudd_400"]
    assert rows[-1]["size"] == "large" and rows[-1]["steps"] == 3000
    assert {r["variant"] for r in rows if not r["audited"]} == {"dense", "layer_static"}
    c = sweep.train_config(rows[-1], 2)
    assert (c.model.n_layers, c.model.d_model, c.seed, c.train.steps, c.data.source) == \
        (8, 256, 2, 3000, "embedded_large")

    runs = tmp_path / "runs"
    with pytest.raises(SystemExit, match="does not exist"):
        sweep.main([f"--runs={runs}", "--report", f"--out={tmp_path / 'out'}"])
    first = sweep.work(runs)
    assert [sweep.describe(i) for i in first[:4]] == [
        "train tiny_feature_gate_400 seed 0", "train tiny_feature_gate_400 seed 1",
        "train tiny_feature_gate_400 seed 2", "audit tiny_feature_gate_400"]
    runs.mkdir()
    with pytest.raises(SystemExit, match="no finished run"):
        sweep.main([f"--runs={runs}", "--report", f"--out={tmp_path / 'out'}"])
    for row, scale in zip(rows[:2], (0.01, 0.1)):
        for seed in sweep.SEEDS:
            _finish_run(runs, row, seed, 2.5 + seed / 100)
        _finish_audit(runs, row, scale)
    left = sweep.work(runs)
    assert len(left) == len(first) - 8 and sweep.describe(left[0]).startswith(
        "train tiny_feature_gate_1500")

    out = tmp_path / "out"
    sweep.main([f"--runs={runs}", "--report", f"--out={out}"])
    assert sorted(p.name for p in out.iterdir()) == [
        "featuregate.png", "mudd.png", "results.json", "table.md"]
    data = json.loads((out / "results.json").read_text())
    assert data["command"].startswith("python scripts/fca_sweep.py --runs=")
    assert data["ratios"] == [{"size": "tiny", "steps": 400, "ratio": pytest.approx(
        {c: 10.0 for c in sweep.CONDITIONS})}]
    md = (out / "table.md").read_text()
    assert "| tiny | 400 | 1,638,400 | 2.5100 | +0.01 [+0, +0.02] |" in md
    assert "| 90.0% [85.0%, 95.0%] | not met | not met | cpu (cpu) |" in md
    assert "paper: FeatureGate 76M" in md and "Not finished yet: tiny_feature_gate_1500" in md
    assert "| tiny | mudd | 400 | 1,638,400 | 2.5000 | 2.5100 | 2.5200 | 2.5100 | cpu (cpu) |" in md
    assert not list(tmp_path.glob(".out.tmp-*"))   # written atomically, nothing left behind
