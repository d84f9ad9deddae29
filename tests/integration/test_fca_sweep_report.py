"""The FCA sweep's report across machines (tests/unit/test_fca_sweep.py holds the plan and the
rows): rows whose runs are gone are carried forward, marked."""
import json

from experiments import fca_sweep as sweep
from tests.unit.test_fca_sweep import _finish_audit, _finish_run


def test_report_carries_forward_rows_whose_runs_are_gone(tmp_path):
    """A report from a new runs directory (a fresh machine) keeps, whole and marked, each row
    the earlier report holds more of; a row the new runs hold as much of comes from them;
    --fresh reports the new runs alone. Files the report does not write stay."""
    rows = {sweep.row_name(r): r for r in sweep.planned_rows()}
    fg, mudd = rows["tiny_feature_gate_400"], rows["tiny_mudd_400"]
    old, new, out = tmp_path / "old", tmp_path / "new", tmp_path / "out"
    for seed in sweep.SEEDS:
        _finish_run(old, fg, seed, 2.6)
    _finish_audit(old, fg, 0.01)
    _finish_run(old, mudd, 0, 2.7)
    sweep.main([f"--runs={old}", "--report", f"--out={out}"])
    (out / "README.md").write_text("the reading, by hand")      # what the report does not write
    (out / "archive").mkdir()
    (out / "archive" / "seed0.tgz").write_bytes(b"runs")
    _finish_run(new, mudd, 0, 2.4)                       # further than the old row: taken
    _finish_audit(new, mudd, 0.3, seed=0)
    _finish_run(new, fg, 0, 2.3)                         # less than the old row: not taken
    sweep.main([f"--runs={new}", "--report", f"--out={out}"])

    data = json.loads((out / "results.json").read_text())
    by_name = {r["name"]: r for r in data["rows"]}
    assert by_name["tiny_feature_gate_400"]["test_bpb"] == {"0": 2.6, "1": 2.6, "2": 2.6}
    assert by_name["tiny_feature_gate_400"]["audit"]["conditions"]["cross_input"][
        "estimate"] == 0.01
    assert by_name["tiny_feature_gate_400"]["carried"]["command"] == \
        f"python experiments/fca_sweep.py --runs={old.name} --report --out={out.name}"
    assert by_name["tiny_mudd_400"]["test_bpb"] == {"0": 2.4}
    assert "carried" not in by_name["tiny_mudd_400"]
    assert by_name["tiny_mudd_400"]["seed_audits"]["0"]["conditions"]["cross_input"][
        "estimate"] == 0.3
    md = (out / "table.md").read_text()
    assert "| tiny | feature_gate | 400 | 1,638,400 | 2.6000 | 2.6000 | 2.6000 | 2.6000 | " \
           "cpu (cpu) † |" in md
    assert "| tiny | mudd | 400 | 1,638,400 | 2.4000 | — | — | 2.4000 | cpu (cpu) |" in md
    assert f"(`python experiments/fca_sweep.py --runs={old.name} --report --out={out.name}`)" in md
    assert md.count("†") == 3                 # two rows of the FeatureGate run, one footnote
    assert "## Seeds audited, their row not yet complete" in md
    assert "| MUDD | tiny | 400 | 0 | 2.4000 | +0.3 [+0, +0.6] |" in md

    sweep.main([f"--runs={new}", "--report", f"--out={out}"])     # carried again, same source
    again = json.loads((out / "results.json").read_text())
    assert {r["name"]: r.get("carried") for r in again["rows"]} == \
        {r["name"]: r.get("carried") for r in data["rows"]}
    sweep.main([f"--runs={new}", "--report", f"--out={out}", "--fresh"])
    fresh = {r["name"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert fresh["tiny_feature_gate_400"]["test_bpb"] == {"0": 2.3}
    assert fresh["tiny_feature_gate_400"]["audit"] is None
    assert "†" not in (out / "table.md").read_text()
    assert (out / "README.md").read_text() == "the reading, by hand"    # kept by every report
    assert (out / "archive" / "seed0.tgz").read_bytes() == b"runs"
