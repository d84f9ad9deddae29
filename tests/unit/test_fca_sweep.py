"""experiments/fca_sweep.py: the grid's order (cheapest first, whole rows), resumption (finished
runs and audits skipped), and the report from run and audit files of the shape train.py and
audit.py write."""
import json
import shutil

import pytest

from experiments import fca_sweep as sweep


def _finish_run(runs, row, seed, bpb, checkpoint=True):
    d = sweep.run_dir(runs, row, seed)
    d.mkdir(parents=True, exist_ok=True)
    if checkpoint:
        (d / "checkpoints" / str(row["steps"])).mkdir(parents=True)
    (d / "eval.json").write_text(json.dumps({"step": row["steps"], "test": {"bpb": bpb}}))
    (d / "sweep_device.json").write_text(json.dumps({"platform": "cpu", "device_kind": "cpu"}))


def _finish_audit(runs, row, scale, seed=None):
    """An audit results.json with the fields the report reads (audit.py writes many more):
    the row's, or with ``seed`` that seed's own."""
    labels = dict(zip(sweep.CONDITIONS, ("Cross-input", "Token-shuffle", "Cross+shuffle",
                                         "Layer×PositionMean", "LayerMean", "GlobalMean")))
    conds = {c: {"label": labels[c], "estimate": scale * (i + 1), "ci_low": scale * i,
                 "ci_high": scale * (i + 2), "p": 0.25} for i, c in enumerate(sweep.CONDITIONS)}
    conds["static_profile"].update(
        retention={"estimate": 0.9, "ci_low": 0.85, "ci_high": 0.95},
        verdicts={"practically_small": {"met": False}, "high_retention": {"met": False}})
    res = {"conditions": conds, "effects": {}, "replay": {"exact": True, "nll": 1.7},
           "meta": {"checkpoints": [{"name": sweep.run_dir(runs, row, s).name} for s in (
               sweep.SEEDS if seed is None else [seed])], "windows": {"eval": 512}}}
    d = sweep.audit_dir(runs, row) if seed is None else sweep.seed_audit_dir(runs, row, seed)
    d.mkdir(parents=True)
    (d / "results.json").write_text(json.dumps(res))


def test_order_resume_and_report(tmp_path):
    rows = sweep.planned_rows()
    assert [sweep.row_name(r) for r in rows[:2]] == ["tiny_feature_gate_400", "tiny_mudd_400"]
    assert [sweep.row_name(r) for r in rows[-4:]] == [
        "large_feature_gate_3000", "large_mudd_3000", "xl_feature_gate_3000", "xl_mudd_3000"]
    assert {r["variant"] for r in rows if not r["audited"]} == {"dense", "layer_static"}
    c = sweep.train_config(rows[-3], 2)
    assert (c.model.n_layers, c.model.d_model, c.seed, c.train.steps, c.data.source) == \
        (8, 256, 2, 3000, "embedded_large")
    c = sweep.train_config(rows[-1], 0)
    assert (c.model.n_layers, c.model.d_model, c.model.n_heads, c.model.d_ff, c.train.lr,
            c.model.variant) == (12, 384, 12, 1536, 5e-4, "mudd")

    runs = tmp_path / "runs"
    with pytest.raises(SystemExit, match="does not exist"):
        sweep.main([f"--runs={runs}", "--report", f"--out={tmp_path / 'out'}"])
    first = sweep.work(runs)
    assert [sweep.describe(i) for i in first[:8]] == [   # each seed audited once trained
        "train tiny_feature_gate_400 seed 0", "audit tiny_feature_gate_400 seed 0",
        "train tiny_feature_gate_400 seed 1", "audit tiny_feature_gate_400 seed 1",
        "train tiny_feature_gate_400 seed 2", "audit tiny_feature_gate_400 seed 2",
        "combine tiny_feature_gate_400", "train tiny_mudd_400 seed 0"]
    runs.mkdir()
    with pytest.raises(SystemExit, match="no finished run"):
        sweep.main([f"--runs={runs}", "--report", f"--out={tmp_path / 'out'}"])
    for row, scale in zip(rows[:2], (0.01, 0.1)):
        for seed in sweep.SEEDS:
            _finish_run(runs, row, seed, 2.5 + seed / 100)
        _finish_audit(runs, row, scale)
    left = sweep.work(runs)
    assert len(left) == len(first) - 14 and sweep.describe(left[0]).startswith(
        "train tiny_feature_gate_1500")
    row = sweep.planned_rows()[2]
    _finish_run(runs, row, 0, 2.4)
    _finish_audit(runs, row, 0.02, seed=0)  # a stopped sweep: seed 0 trained and audited,
    _finish_run(runs, row, 1, 2.4)          # seed 1 trained, not yet audited
    assert [sweep.describe(i) for i in sweep.work(runs)[:4]] == [
        "audit tiny_feature_gate_1500 seed 1", "train tiny_feature_gate_1500 seed 2",
        "audit tiny_feature_gate_1500 seed 2", "combine tiny_feature_gate_1500"]
    shutil.rmtree(sweep.run_dir(runs, row, 0) / "checkpoints")   # audited: not needed
    assert sweep.run_done(runs, row, 0) and not sweep.run_done(runs, row, 2)
    for seed in (0, 1):
        shutil.rmtree(sweep.run_dir(runs, row, seed))
    shutil.rmtree(sweep.seed_audit_dir(runs, row, 0))

    out = tmp_path / "out"
    sweep.main([f"--runs={runs}", "--report", f"--out={out}"])
    assert sorted(p.name for p in out.iterdir()) == [
        "featuregate.pdf", "featuregate.png", "featuregate.svg", "mudd.pdf", "mudd.png",
        "mudd.svg", "results.json", "table.md"]
    data = json.loads((out / "results.json").read_text())
    assert data["command"].startswith("python experiments/fca_sweep.py --runs=")
    assert data["ratios"] == [{"size": "tiny", "steps": 400, "ratio": pytest.approx(
        {c: 10.0 for c in sweep.CONDITIONS})}]
    md = (out / "table.md").read_text()
    assert "| tiny | 400 | 1,638,400 | 2.5100 | +0.01 [+0, +0.02] |" in md
    assert "| 90.0% [85.0%, 95.0%] | not met | not met | cpu (cpu) |" in md
    assert "paper: FeatureGate 76M" in md and "Not finished yet: tiny_feature_gate_1500" in md
    assert "| tiny | mudd | 400 | 1,638,400 | 2.5000 | 2.5100 | 2.5200 | 2.5100 | cpu (cpu) |" in md
    assert not list(tmp_path.glob(".out.tmp-*"))   # written atomically, nothing left behind


def test_device_rows_travel_back_without_checkpoints_and_count_as_done(tmp_path):
    """A device call plans only --rows, exports its runs and audits without checkpoints, and
    the import adds what the local sweep lacks: a trained run with its row's audit is done
    here, one without the audit is trained again (nothing to audit it from), and a finished
    local run is never replaced."""
    rows = {sweep.row_name(r): r for r in sweep.planned_rows()}
    fg, mudd = rows["large_feature_gate_3000"], rows["large_mudd_3000"]
    device, local = tmp_path / "device", tmp_path / "local"
    assert [sweep.describe(i) for i in sweep.work(device, "large_mudd")] == [
        "train large_mudd_3000 seed 0", "audit large_mudd_3000 seed 0",
        "train large_mudd_3000 seed 1", "audit large_mudd_3000 seed 1",
        "train large_mudd_3000 seed 2", "audit large_mudd_3000 seed 2",
        "combine large_mudd_3000"]
    assert {i[1]["size"] for i in sweep.work(device, "large")} == {"large"}
    for seed in sweep.SEEDS:
        _finish_run(device, fg, seed, 2.0 + seed / 100)
        _finish_run(device, mudd, seed, 1.9)
    _finish_audit(device, fg, 0.01)                       # MUDD's row audit did not fit,
    _finish_audit(device, mudd, 0.5, seed=0)              # its seed 0's own audit did
    (device / "sweep_log.jsonl").write_text('{"item": "train large_feature_gate_3000 seed 0"}\n')
    _finish_run(local, fg, 1, 2.5)                        # finished here already: kept
    partial = sweep.run_dir(local, mudd, 0) / "checkpoints" / "500"
    partial.mkdir(parents=True)                           # partial here: replaced

    sweep.main([f"--runs={device}", f"--export={tmp_path / 'sweep.tgz'}"])
    import tarfile
    with tarfile.open(tmp_path / "sweep.tgz") as tar:
        names = tar.getnames()
    assert "audit/large_feature_gate_3000/results.json" in names
    assert not [n for n in names if "checkpoints" in n]

    added = sweep.import_runs(tmp_path / "sweep.tgz", local)
    assert sorted(added) == sorted(["large_feature_gate_3000_s0", "large_feature_gate_3000_s2",
                                    "audit/large_feature_gate_3000", "large_mudd_3000_s0",
                                    "audit/large_mudd_3000_s0", "large_mudd_3000_s1",
                                    "large_mudd_3000_s2"])
    assert json.loads((sweep.run_dir(local, fg, 1) / "eval.json").read_text())["test"][
        "bpb"] == 2.5
    assert not partial.exists()
    assert (local / "sweep_log.jsonl").read_text().count("large_feature_gate_3000") == 1
    left = [sweep.describe(i) for i in sweep.work(local, "large")]
    assert left == ["train large_mudd_3000 seed 1", "audit large_mudd_3000 seed 1",
                    "train large_mudd_3000 seed 2", "audit large_mudd_3000 seed 2",
                    "combine large_mudd_3000"]
    bpb = {r["name"]: r["test_bpb"] for r in sweep.collect(local)["rows"]}
    assert bpb["large_feature_gate_3000"] == {0: 2.0, 1: 2.5, 2: 2.02}
    assert sweep.import_runs(tmp_path / "sweep.tgz", local) == []   # idempotent
    assert (local / "sweep_log.jsonl").read_text().count("large_feature_gate_3000") == 1
    assert not list(local.glob(".import-*"))
    with pytest.raises(SystemExit, match="is not a file"):
        sweep.main([f"--runs={local}", f"--import={tmp_path / 'missing.tgz'}"])


def test_seeds_split_a_row_between_processes(tmp_path, capsys):
    """--seeds: each process plans only its seeds' runs and audits; the row's combine is
    planned by each, and done by whichever finds every seed audited."""
    runs = tmp_path / "runs"
    row = next(r for r in sweep.planned_rows() if sweep.row_name(r) == "large_mudd_3000")
    assert [sweep.describe(i) for i in sweep.work(runs, "large_mudd", seeds=(1,))] == [
        "train large_mudd_3000 seed 1", "audit large_mudd_3000 seed 1",
        "combine large_mudd_3000"]
    for seed in (0, 2):
        _finish_run(runs, row, seed, 2.0)
        _finish_audit(runs, row, 0.1, seed=seed)
    assert sweep.work(runs, "large_mudd", seeds=(0, 2)) == [
        ("combine", row, None)]                  # seed 1 not audited: not yet combinable
    sweep.main([f"--runs={runs}", "--plan", "--rows=large_mudd", "--seeds=2,0"])
    assert capsys.readouterr().out.split("\n")[0] == "combine large_mudd_3000"
    for bad in ("3", "x", ""):
        with pytest.raises(SystemExit):
            sweep.main([f"--runs={runs}", "--plan", f"--seeds={bad}"])
    assert "--seeds=" in capsys.readouterr().err
