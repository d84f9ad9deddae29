"""Recompute an audit's statistics from the values its results.json stores, and rewrite it.

    .venv/bin/python experiments/restat_results.py results/main [results/fca_tiny/... ...]

For an audit whose checkpoints are gone but whose statistics code changed: the per-window
(or, with several checkpoints, per-checkpoint) ΔNLL that results.json keeps are the
measurements; every summary (CIs, p-values, Holm, retention, verdicts, warnings) is
recomputed from them by the current code (dynjax.audit.summary.summarize_stored) and
report.md, results.json and the plots are rewritten atomically (report.write_report).
Nothing measured changes; meta.restat records when and how. tests/unit/test_results_files.py
checks that every results.json agrees with the current code.
"""
from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import datetime
import json
import os
import pathlib
import subprocess
import sys
import tempfile


from dynjax.audit import report  # noqa: E402
from dynjax.audit.summary import summarize_stored  # noqa: E402


def restat(results: dict) -> dict:
    fresh = summarize_stored(results)
    if fresh is None:
        raise SystemExit("one checkpoint without per-window values: nothing to recompute from")
    for section in ("conditions", "effects"):
        for name, row in fresh[section].items():   # not-applicable rows stay as they are
            label = results[section][name].get("label")
            results[section][name] = dict(row, **({"label": label} if label else {}))
    results.pop("small_n_warning", None)
    if "small_n_warning" in fresh:
        results["small_n_warning"] = fresh["small_n_warning"]
    results["replay"].setdefault("atol", results["meta"]["settings"]["replay_atol"])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=pathlib.Path(__file__).parent).stdout.strip()
    results["meta"]["restat"] = (
        f"statistics recomputed from the stored values by experiments/restat_results.py on "
        f"{datetime.date.today()} (code at {commit}); the measurements are unchanged")
    return results


def main(dirs):
    for d in map(pathlib.Path, dirs):
        results = restat(json.loads((d / "results.json").read_text()))
        # write_report replaces a whole directory; d also holds other files (eval.json), so
        # the report is written beside it and each of its files moved in (os.replace).
        with tempfile.TemporaryDirectory(dir=d.parent) as tmp:
            out = report.write_report(results, pathlib.Path(tmp) / "report")
            for f in out.iterdir():
                os.replace(f, d / f.name)
        print(f"rewrote {d}")


if __name__ == "__main__":
    main(sys.argv[1:])
