"""Do the audit paper's conclusions emerge with training and size? The FCA trend sweep.

    python scripts/fca_sweep.py --runs=/work/runs/sweep                 # train + audit, resumable
    python scripts/fca_sweep.py --runs=/work/runs/sweep --budget-minutes=9   # one device call
    python scripts/fca_sweep.py --runs=/work/runs/sweep --plan          # what is done / left
    python scripts/fca_sweep.py --runs=/work/runs/sweep --report        # results/fca_sweep/

The grid (issue 16), every run on ``data.source=embedded_large`` (21.6 MB), batch 32 x 128:

- FeatureGate (configs/tiny.py:feature_gate) and MUDD (configs/mudd_tiny.py:mudd) at the
  tiny size (4 layers, d=128) for 400, 1500 and 5000 steps, and at a larger size (8 layers,
  d=256, 8 heads, d_ff=1024, lr 1e-3) for 3000 steps; seeds 0, 1, 2;
- dense and layer_static beside FeatureGate at the longest setting (tiny, 5000 steps), for
  the bits/byte table.

Each FeatureGate / MUDD row (one setting, its three seeds) is audited with the paper's
protocol: 512 calibration and 512 evaluation windows, R = 20 (configs/audit_tiny.py with
those overrides, through dynjax.audit.run, the program behind audit.py); each seed is one unit.

Work goes cheapest first (a row's cost ~ steps x layers x d^2), a row's three seeds and then
its audit, so a partial sweep leaves whole rows. Rerunning skips finished runs and audits and
resumes an interrupted run from its last checkpoint (train.py's resume), so the same command
continues after a kill, on this machine or another. ``--budget-minutes`` stops starting new
work once that much time has passed, so one bounded device call does as much as fits.
Each run records where it ran (``RUN/sweep_device.json``); the report names it per row.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SEEDS = (0, 1, 2)
BATCH, SEQ_LEN = 32, 128
DATA_SOURCE = "embedded_large"
SIZES = {  # name -> model/train overrides on top of configs/tiny.py or configs/mudd_tiny.py
    "tiny": dict(model={}, train={}),
    "large": dict(model=dict(n_layers=8, d_model=256, n_heads=8, d_ff=1024),
                  train=dict(lr=1e-3)),
}
FAMILIES = {  # variant -> (config module, family label); audited variants only
    "feature_gate": ("configs.tiny", "FeatureGate"),
    "mudd": ("configs.mudd_tiny", "MUDD"),
}
BASELINES = ("dense", "layer_static")   # configs/tiny.py variants, bits/byte only
AUDIT = dict(calib_windows=512, eval_windows=512, reassignments=20)


def planned_rows():
    """Every row of the grid as dicts (variant, size, steps, audited), cheapest first."""
    rows = [dict(variant=v, size="tiny", steps=s, audited=True)
            for s in (400, 1500, 5000) for v in FAMILIES]
    rows += [dict(variant=v, size="tiny", steps=5000, audited=False) for v in BASELINES]
    rows += [dict(variant=v, size="large", steps=3000, audited=True) for v in FAMILIES]
    return sorted(rows, key=row_cost)   # stable: the order above breaks ties


def row_cost(row) -> float:
    """Relative compute of a row: steps x layers x d_model^2 (the matmul FLOPs' scaling)."""
    m = SIZES[row["size"]]["model"]
    return row["steps"] * m.get("n_layers", 4) * (m.get("d_model", 128) / 128) ** 2


def row_name(row) -> str:
    return f"{row['size']}_{row['variant']}_{row['steps']}"


def run_dir(runs: pathlib.Path, row, seed: int) -> pathlib.Path:
    return runs / f"{row_name(row)}_s{seed}"


def audit_dir(runs: pathlib.Path, row) -> pathlib.Path:
    return runs / "audit" / row_name(row)


def train_config(row, seed: int):
    """The resolved training config of one run: the family's tiny config, the size's
    overrides, the sweep's data, steps and seed."""
    import importlib

    module = FAMILIES.get(row["variant"], ("configs.tiny",))[0]
    c = importlib.import_module(module).get_config(row["variant"])
    size = SIZES[row["size"]]
    c.model.update(size["model"])
    c.train.update(size["train"])
    c.seed = seed
    c.data.source = DATA_SOURCE
    c.data.seq_len = SEQ_LEN
    c.train.batch_size = BATCH
    c.train.steps = row["steps"]
    c.train.eval_every = row["steps"]           # evaluate once, at the end
    c.train.ckpt_every = min(500, row["steps"])  # resumable within a long run
    c.train.log_every = 50
    return c


def run_finished(path: pathlib.Path, steps: int) -> bool:
    return (path / "eval.json").exists() and (path / "checkpoints" / str(steps)).is_dir()


def audit_finished(runs: pathlib.Path, row) -> bool:
    """An audit counts only if it audited exactly this row's seeds."""
    path = audit_dir(runs, row) / "results.json"
    if not path.exists():
        return False
    try:
        names = [c.get("name") for c in json.loads(path.read_text())["meta"]["checkpoints"]]
    except (ValueError, KeyError, TypeError):
        return False
    return sorted(names) == sorted(run_dir(runs, row, s).name for s in SEEDS)


def audit_config():
    from configs import audit_tiny

    c = audit_tiny.get_config()
    c.data.calib_windows = AUDIT["calib_windows"]
    c.data.eval_windows = AUDIT["eval_windows"]
    c.reassignments = AUDIT["reassignments"]
    return c


def device_info() -> dict:
    import jax

    d = jax.devices()[0]
    return {"platform": d.platform, "device_kind": d.device_kind,
            "devices": jax.device_count(), "host": platform.node(), "cpus": os.cpu_count()}


def work(runs: pathlib.Path):
    """The remaining work items, in order: ("train", row, seed) and ("audit", row)."""
    items = []
    for row in planned_rows():
        for seed in SEEDS:
            if not run_finished(run_dir(runs, row, seed), row["steps"]):
                items.append(("train", row, seed))
        if row["audited"] and not audit_finished(runs, row):
            items.append(("audit", row, None))
    return items


def describe(item) -> str:
    kind, row, seed = item
    return f"{kind} {row_name(row)}" + (f" seed {seed}" if seed is not None else "")


def run_sweep(runs: pathlib.Path, budget_s: float | None, log=print) -> list:
    """Do the remaining work in order until done or ``budget_s`` has passed; returns what is
    left. Each item is timed into RUNS/sweep_log.jsonl."""
    from dynjax.audit import run as audit_run
    from dynjax.train.loop import train
    from dynjax.train.metrics import write_json_atomic

    runs.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    items = work(runs)
    while items:
        if budget_s is not None and time.monotonic() - t0 > budget_s:
            log(f"budget of {budget_s / 60:.1f} min spent; {len(items)} items left, first: "
                f"{describe(items[0])}")
            break
        item = items.pop(0)
        kind, row, seed = item
        log(f"[{time.strftime('%H:%M:%S')}] {describe(item)}")
        start = time.monotonic()
        if kind == "train":
            path = run_dir(runs, row, seed)
            result = train(train_config(row, seed), str(path), progress=False)
            write_json_atomic(path / "sweep_device.json", device_info())
            log(f"  test {result['test']['bpb']:.4f} bits/byte")
        else:
            if not all(run_finished(run_dir(runs, row, s), row["steps"]) for s in SEEDS):
                continue  # a seed failed to finish; the next invocation retries it
            audit_run.audit_from_config(audit_config(), [str(run_dir(runs, row, s))
                                                         for s in SEEDS],
                                        out=str(audit_dir(runs, row)), progress=False, log=log)
        with open(runs / "sweep_log.jsonl", "a") as f:
            f.write(json.dumps({"item": describe(item), "seconds": time.monotonic() - start,
                                "device": device_info(), "time": time.time()}) + "\n")
    return items


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", required=True, help="directory of run and audit directories")
    p.add_argument("--budget-minutes", type=float, default=None,
                   help="start no new run or audit after this many minutes")
    p.add_argument("--plan", action="store_true", help="list the remaining work and exit")
    p.add_argument("--report", action="store_true",
                   help="write the table, JSON and figures from whatever has finished")
    p.add_argument("--out", default=str(ROOT / "results" / "fca_sweep"),
                   help="--report's output directory")
    args = p.parse_args(argv)
    runs = pathlib.Path(args.runs)
    if args.plan:
        left = work(runs)
        print("\n".join(describe(i) for i in left) or "nothing left: the sweep is complete")
        return
    if args.report:
        from sweep_report import write_report  # noqa: E402 - scripts/ sibling module

        write_report(runs, pathlib.Path(args.out), argv if argv is not None else sys.argv[1:])
        return
    from dynjax.audit.run import AuditError, ReplayError
    from dynjax.data.text import DataError

    try:
        left = run_sweep(runs, None if args.budget_minutes is None else args.budget_minutes * 60)
    except (DataError, AuditError, ReplayError, ValueError) as e:
        raise SystemExit(f"fca_sweep.py: error: {e}") from None
    print("sweep complete" if not left else f"{len(left)} items left; rerun to continue")


if __name__ == "__main__":
    main()
