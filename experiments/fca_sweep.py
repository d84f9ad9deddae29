"""Do the audit paper's conclusions emerge with training and size? The FCA trend sweep.

    python experiments/fca_sweep.py --runs=/work/runs/sweep                 # train + audit, resumable
    python experiments/fca_sweep.py --runs=runs/sweep_gpu --rows=large --budget-minutes=9  # a device
    python experiments/fca_sweep.py --runs=runs/sweep_gpu --export=$OUT/sweep.tgz  # ...sends it back
    python experiments/fca_sweep.py --runs=/work/runs/sweep --import=sweep.tgz   # ...added here
    python experiments/fca_sweep.py --runs=/work/runs/sweep --plan          # what is done / left
    python experiments/fca_sweep.py --runs=/work/runs/sweep --rows=large_mudd --seeds=1  # one seed
    python experiments/fca_sweep.py --runs=/work/runs/sweep --report        # results/fca_sweep/

The grid (issue 16), every run on ``data.source=embedded_large`` (21.6 MB), batch 32 x 128:

- FeatureGate (configs/tiny.py:feature_gate) and MUDD (configs/mudd_tiny.py:mudd) at the
  tiny size (4 layers, d=128) for 400, 1500 and 5000 steps, and at a larger size (8 layers,
  d=256, 8 heads, d_ff=1024, lr 1e-3) for 3000 steps; seeds 0, 1, 2;
- a third size, ``xl`` (12 layers, d=384, 12 heads, d_ff=1536, about 21M parameters, lr 5e-4
  continuing the tiny -> larger learning-rate trend) for the same 3000 steps (issue 30): on
  2 CPU cores about 2.2 h (FeatureGate) and 3.4 h (MUDD) of train steps a seed (2.69 s and
  4.02 s, train.py's step: results/fca_sweep/step_time/); last in the order, ``--rows=xl``;
- dense and layer_static beside FeatureGate at the longest setting (tiny, 5000 steps), for
  the bits/byte table.

Each FeatureGate / MUDD row (one setting, its three seeds) is audited with the paper's
protocol: 512 calibration and 512 evaluation windows, R = 20 (configs/audit_tiny.py with
those overrides, through dynjax.audit.run, the program behind audit.py); each seed is one unit.

Work goes cheapest first (a row's cost ~ steps x layers x d^2). Within a row each seed is
audited as soon as it has trained, and the row's audit combines the three (audit.py
--combine: the same numbers as one audit of all three), so a stopped sweep keeps every
finished seed's audit, and that seed's checkpoint is no longer needed. Rerunning skips
finished runs and audits and resumes an interrupted run from its last checkpoint (train.py's
resume), so the same command continues after a kill, on this machine or another.
``--budget-minutes`` stops starting new work once that much time has passed, so one bounded
device call does as much as fits. ``--seeds`` does only the given seeds' runs and audits, so
several processes (one per seed, where the cores allow) share a row.
Each run records where it ran (``RUN/sweep_device.json``); the report names it per row.
A device call does only the rows it is given (``--rows``) and sends back, in one archive, all
but the checkpoints (``--export``); ``--import`` adds what this sweep has not done, and a
trained run counts as done here when its audit came with it.
(``bash scripts/gpu_checks.sh sweep`` is that device call.)
``--report`` carries forward each row the report already in ``--out`` holds more of than
``--runs`` does (marked † in the table): run directories outlive neither a lost machine nor a
fresh clone, the committed report does. ``--fresh`` reports ``--runs`` alone.
On a machine without the registries (a device machine), copy the four text archives
(``python -m dynjax.data.fetch`` puts them in .data/) to a directory and set $DYNJAX_DATA to it.
"""
from __future__ import annotations

from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse
import json
import os
import pathlib
import platform
import shlex
import sys
import time

from dynjax.figures import fit, save, styled  # noqa: E402
from dynjax.jsonio import portable, versions  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]

SEEDS = (0, 1, 2)
BATCH, SEQ_LEN = 32, 128
DATA_SOURCE = "embedded_large"
SIZES = {  # name -> model/train overrides on top of configs/tiny.py or configs/mudd_tiny.py
    "tiny": dict(model={}, train={}),
    "large": dict(model=dict(n_layers=8, d_model=256, n_heads=8, d_ff=1024),
                  train=dict(lr=1e-3)),
    "xl": dict(model=dict(n_layers=12, d_model=384, n_heads=12, d_ff=1536),
               train=dict(lr=5e-4)),
}
FAMILIES = {  # variant -> (config module, family label); audited variants only
    "feature_gate": ("dynjax.configs.tiny", "FeatureGate"),
    "mudd": ("dynjax.configs.mudd_tiny", "MUDD"),
}
BASELINES = ("dense", "layer_static")   # configs/tiny.py variants, bits/byte only
AUDIT = dict(calib_windows=512, eval_windows=512, reassignments=20)


def planned_rows():
    """Every row of the grid as dicts (variant, size, steps, audited), cheapest first."""
    rows = [dict(variant=v, size="tiny", steps=s, audited=True)
            for s in (400, 1500, 5000) for v in FAMILIES]
    rows += [dict(variant=v, size="tiny", steps=5000, audited=False) for v in BASELINES]
    rows += [dict(variant=v, size=size, steps=3000, audited=True)
             for size in ("large", "xl") for v in FAMILIES]
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


def seed_audit_dir(runs: pathlib.Path, row, seed: int) -> pathlib.Path:
    """One seed's own audit, made as soon as it finished training; the row's audit combines
    its seeds' (audit.py --combine)."""
    return runs / "audit" / run_dir(runs, row, seed).name


def train_config(row, seed: int):
    """The resolved training config of one run: the family's tiny config, the size's
    overrides, the sweep's data, steps and seed."""
    import importlib

    module = FAMILIES.get(row["variant"], ("dynjax.configs.tiny",))[0]
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


def _read_json(path: pathlib.Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def final_eval(path: pathlib.Path, steps: int) -> dict | None:
    """The run's eval.json if it was trained to the end (train.py writes it last), else None."""
    ev = _read_json(path / "eval.json")
    return ev if isinstance(ev, dict) and ev.get("step") == steps else None


def run_trained(path: pathlib.Path, steps: int) -> bool:
    return final_eval(path, steps) is not None


def run_finished(path: pathlib.Path, steps: int) -> bool:
    """Trained, with the final checkpoint an audit loads."""
    return run_trained(path, steps) and (path / "checkpoints" / str(steps)).is_dir()


def run_done(runs: pathlib.Path, row, seed: int) -> bool:
    """Nothing left to train: finished, or trained and nothing more needs its checkpoint (an
    unaudited row, or its audit already done), as an imported device run comes back."""
    path = run_dir(runs, row, seed)
    return run_finished(path, row["steps"]) or (run_trained(path, row["steps"]) and (
        not row["audited"] or seed_audited(runs, row, seed)))


def _audited_names(path: pathlib.Path) -> list | None:
    try:
        return sorted(c.get("name") for c in
                      json.loads((path / "results.json").read_text())["meta"]["checkpoints"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def audit_finished(runs: pathlib.Path, row) -> bool:
    """An audit counts only if it audited exactly this row's seeds."""
    return _audited_names(audit_dir(runs, row)) == \
        sorted(run_dir(runs, row, s).name for s in SEEDS)


def seed_audited(runs: pathlib.Path, row, seed: int) -> bool:
    """The seed's own audit is done, or the row's (which holds it)."""
    return audit_finished(runs, row) or \
        _audited_names(seed_audit_dir(runs, row, seed)) == [run_dir(runs, row, seed).name]


def audit_config():
    from dynjax.configs import audit_tiny

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


def work(runs: pathlib.Path, rows: str | None = None, seeds=SEEDS):
    """The remaining work items, in order: ("train", row, seed), ("audit", row, seed) right
    after it (an audited row), then ("combine", row, None). ``rows``: comma-separated parts of
    row names; only rows whose name contains one are planned. ``seeds``: only these seeds'
    items (a row is still combined only once all of SEEDS are audited), so several processes
    can share a row, one seed each."""
    parts = [r for r in (rows or "").split(",") if r]
    items = []
    for row in planned_rows():
        if parts and not any(part in row_name(row) for part in parts):
            continue
        for seed in seeds:
            if not run_done(runs, row, seed):
                items.append(("train", row, seed))
            if row["audited"] and not seed_audited(runs, row, seed):
                items.append(("audit", row, seed))
        if row["audited"] and not audit_finished(runs, row):
            items.append(("combine", row, None))
    return items


def describe(item) -> str:
    kind, row, seed = item
    return f"{kind} {row_name(row)}" + (f" seed {seed}" if seed is not None else "")


def run_sweep(runs: pathlib.Path, budget_s: float | None, log=print, rows=None,
              seeds=SEEDS) -> list:
    """Do the remaining work in order until done or ``budget_s`` has passed; returns what is
    left. Each item is timed into RUNS/sweep_log.jsonl."""
    from dynjax.audit import run as audit_run
    from dynjax.train.loop import train
    from dynjax.jsonio import write_json_atomic

    runs.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    items = work(runs, rows, seeds)
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
        elif kind == "audit":
            if not run_finished(run_dir(runs, row, seed), row["steps"]):
                continue  # the seed failed to finish; the next invocation retries it
            audit_run.audit_from_config(audit_config(), [str(run_dir(runs, row, seed))],
                                        out=str(seed_audit_dir(runs, row, seed)),
                                        progress=False, log=log)
        else:
            if not all(seed_audited(runs, row, s) for s in SEEDS):
                continue
            audit_run.combine_dirs([str(seed_audit_dir(runs, row, s)) for s in SEEDS],
                                   out=str(audit_dir(runs, row)))
        with open(runs / "sweep_log.jsonl", "a") as f:
            f.write(json.dumps({"item": describe(item), "seconds": time.monotonic() - start,
                                "device": device_info(), "time": time.time()}) + "\n")
    return items


# ---------------------------------------------------------------------------- transfer

def export_runs(runs: pathlib.Path, archive: pathlib.Path) -> None:
    """``runs`` without checkpoints as one .tar.gz, written atomically: what a device run sends
    back (its checkpoints are too large to travel; eval.json, metrics and audits are not)."""
    import tarfile

    from dynjax.jsonio import atomic_write

    if not runs.is_dir():
        raise SystemExit(f"fca_sweep.py: error: --runs={runs} does not exist")

    def without_checkpoints(info):
        return None if "checkpoints" in pathlib.PurePath(info.name).parts else info

    def write(f):
        with tarfile.open(fileobj=f, mode="w:gz") as tar:
            for path in sorted(runs.iterdir()):
                tar.add(path, arcname=path.name, filter=without_checkpoints)
    atomic_write(archive, write)


def import_runs(archive: pathlib.Path, runs: pathlib.Path) -> list:
    """Add an exported sweep to ``runs``: each run it trained that ``runs`` has not (a partial
    local run is replaced) and each audit it finished that ``runs`` has not; its work log's new
    lines are appended; a run's own audit comes with it. Returns what was added. A run that
    comes without its audit (its own or its row's) has no checkpoint to audit, so the sweep
    here trains it again."""
    import shutil
    import tarfile
    import tempfile

    runs.mkdir(parents=True, exist_ok=True)
    added = []
    with tempfile.TemporaryDirectory(prefix=".import-", dir=runs) as tmp:
        tmp = pathlib.Path(tmp)
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        for row in planned_rows():
            seeds = [s for s in SEEDS if run_trained(run_dir(tmp, row, s), row["steps"])
                     and not run_trained(run_dir(runs, row, s), row["steps"])]
            moves = [(run_dir(tmp, row, s), run_dir(runs, row, s)) for s in seeds]
            moves += [(seed_audit_dir(tmp, row, s), seed_audit_dir(runs, row, s)) for s in seeds
                      if row["audited"] and _audited_names(seed_audit_dir(tmp, row, s))]
            if row["audited"] and audit_finished(tmp, row) and not audit_finished(runs, row):
                moves.append((audit_dir(tmp, row), audit_dir(runs, row)))
            for src, dst in moves:
                shutil.rmtree(dst, ignore_errors=True)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(src, dst)
                added.append(str(dst.relative_to(runs)))
        log, here = tmp / "sweep_log.jsonl", runs / "sweep_log.jsonl"
        if log.exists():
            known = set(here.read_text().splitlines()) if here.exists() else set()
            with open(here, "a") as f:
                f.writelines(line + "\n" for line in log.read_text().splitlines()
                             if line not in known)
    return added


# ------------------------------------------------------------------------------ report

# The paper's figures (shared/papers, the FCA paper): FeatureGate 76M (7 seeds) and
# MUDDPythia-1.4B, ΔNLL in nats/token; static retention of the gap to the structure-removed
# reference. cross_shuffle is not reported there.
PAPER = {
    "feature_gate": {"model": "FeatureGate 76M", "conditions": {
        "cross_input": 0.000951, "token_shuffle": 0.001905, "layer_position_mean": 0.000562,
        "static_profile": 0.001287, "structure_removed": 0.098}, "retention": 0.9870},
    "mudd": {"model": "MUDDPythia-1.4B", "conditions": {
        "cross_input": 1.9067, "token_shuffle": 2.9637, "layer_position_mean": 1.0190,
        "static_profile": 1.9798, "structure_removed": 7.4237}, "retention": 0.7333},
}
CONDITIONS = ("cross_input", "token_shuffle", "cross_shuffle", "layer_position_mean",
              "static_profile", "structure_removed")


def _bpb(runs: pathlib.Path, row) -> dict:
    """Test bits/byte of the row's finished seeds (seed -> value)."""
    out = {}
    for seed in SEEDS:
        ev = final_eval(run_dir(runs, row, seed), row["steps"])
        if ev is not None:
            out[seed] = ev["test"]["bpb"]
    return out


def _devices(runs: pathlib.Path, row) -> list:
    kinds = {(d.get("platform"), d.get("device_kind")) for s in SEEDS
             if (d := _read_json(run_dir(runs, row, s) / "sweep_device.json"))}
    return sorted(f"{p} ({k})" for p, k in kinds)


def collect(runs: pathlib.Path) -> dict:
    """Everything finished under ``runs``: one record per planned row, with its audit's
    conditions, retention and verdicts where the audit has finished, else the audits of the
    seeds audited so far (``seed_audits``)."""
    rows = []
    for row in planned_rows():
        rec = dict(row, name=row_name(row), tokens=row["steps"] * BATCH * SEQ_LEN,
                   family=FAMILIES.get(row["variant"], (None, row["variant"]))[1],
                   test_bpb=_bpb(runs, row), devices=_devices(runs, row), audit=None,
                   seed_audits={})
        if row["audited"] and audit_finished(runs, row):
            rec["audit"] = dict(_audit_summary(audit_dir(runs, row)),
                                dir=str(audit_dir(runs, row)))
        elif row["audited"]:
            rec["seed_audits"] = {s: _audit_summary(seed_audit_dir(runs, row, s))
                                  for s in SEEDS if _audited_names(seed_audit_dir(runs, row, s))
                                  == [run_dir(runs, row, s).name]}
        rows.append(rec)
    return {"rows": rows, "paper": PAPER, "audit_protocol": AUDIT, "seeds": list(SEEDS),
            "data_source": DATA_SOURCE, "batch": BATCH, "seq_len": SEQ_LEN}


def _audit_summary(path: pathlib.Path) -> dict:
    """What the report reads from an audit's results.json."""
    res = _read_json(path / "results.json")
    static = res["conditions"]["static_profile"]
    return dict(
        conditions={k: {f: res["conditions"][k].get(f) for f in
                        ("label", "estimate", "ci_low", "ci_high", "p", "ci_method", "note")}
                    for k in CONDITIONS if k in res["conditions"]},
        effects={k: {f: v.get(f) for f in ("estimate", "ci_low", "ci_high", "p_holm")}
                 for k, v in res.get("effects", {}).items()},
        retention={f: static.get("retention", {}).get(f)
                   for f in ("estimate", "ci_low", "ci_high")},
        verdicts={k: v.get("met") for k, v in (static.get("verdicts") or {}).items()},
        replay_exact=res["replay"]["exact"], nll=res["replay"]["nll"],
        units=len(res["meta"]["checkpoints"]), windows=res["meta"].get("windows"))


def _progress(rec) -> tuple:
    return rec["audit"] is not None, len(rec["test_bpb"]), len(rec.get("seed_audits", {}))


def carry_forward(data: dict, previous: dict | None) -> dict:
    """``data`` with each row that ``previous`` (an earlier report's results.json) holds more
    of taken from it, whole and marked ``carried`` with that report's date and command: the
    runs behind an earlier report may live on a machine since lost, and a report from a new
    runs directory must not drop them. A row is never mixed from two sweeps."""
    if not previous:
        return data
    earlier = {r["name"]: r for r in previous.get("rows", [])}
    rows = []
    for rec in data["rows"]:
        old = earlier.get(rec["name"])
        if old is not None and _progress(old) > _progress(rec):
            old = dict(old, test_bpb={int(s): v for s, v in old["test_bpb"].items()},
                       seed_audits={int(s): v for s, v in old.get("seed_audits", {}).items()})
            old.setdefault("carried", {"generated": previous.get("generated"),
                                       "command": previous.get("command")})
            rec = old
        rows.append(rec)
    return dict(data, rows=rows)


def _ratio(x: float) -> str:
    """3 significant figures without an exponent: 5.53, 75.8, 2,010."""
    return f"{float(f'{x:.3g}'):,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _cell(c, fmt="{:+.3g}") -> str:
    if c is None or c.get("estimate") is None:
        return "—"
    ci = "" if c.get("ci_low") is None else \
        f" [{fmt.format(c['ci_low'])}, {fmt.format(c['ci_high'])}]"
    return fmt.format(c["estimate"]) + ci


def _met(v) -> str:
    return {True: "met", False: "not met", None: "undetermined"}[v]


def render_table(data: dict, command: str) -> str:
    """table.md: per family, one line per (size, steps) with ΔNLL and 95% CIs over the three
    seeds, retention and the paper's two prespecified criteria; the MUDD / FeatureGate ratio;
    every finished run's test bits/byte (dense and layer_static at the longest setting);
    what has not finished."""
    rows = data["rows"]
    out = [f"# FCA trend sweep\n\nMade by `{command}`. ΔNLL in nats/token, mean over seeds "
           f"(each seed one unit) with its 95% checkpoint-level bootstrap CI; audit protocol: "
           f"{data['audit_protocol']['calib_windows']} calibration and "
           f"{data['audit_protocol']['eval_windows']} evaluation windows, "
           f"R = {data['audit_protocol']['reassignments']}; data `{data['data_source']}`, "
           f"batch {data['batch']} x {data['seq_len']} bytes. Criteria (prespecified in the "
           "paper): static ΔNLL CI upper bound < 0.002 (small), retention CI lower bound "
           "> 95% (high).\n"]
    for variant, (_, family) in FAMILIES.items():
        paper = data["paper"][variant]
        heads = _labels(rows, variant)
        out += [f"## {family}\n",
                "| size | steps | tokens | test bits/byte | " + " | ".join(heads) +
                " | retention | small | high retention | device |",
                "|---" * (len(CONDITIONS) + 8) + "|"]
        for r in rows:
            if r["variant"] != variant or r["audit"] is None:
                continue
            a = r["audit"]
            bpb = sum(r["test_bpb"].values()) / len(r["test_bpb"])
            out.append(f"| {r['size']} | {r['steps']} | {r['tokens']:,} | {bpb:.4f} | " +
                       " | ".join(_cell(a["conditions"].get(c)) for c in CONDITIONS) +
                       f" | {_cell(a['retention'], '{:.1%}')} | "
                       f"{_met(a['verdicts'].get('practically_small'))} | "
                       f"{_met(a['verdicts'].get('high_retention'))} | "
                       f"{_where(r)} |")
        ref = " | ".join(f"{paper['conditions'][c]:+.3g}" if c in paper["conditions"] else "—"
                         for c in CONDITIONS)
        out += [f"| paper: {paper['model']} | | | | {ref} | {paper['retention']:.1%} | | | |",
                ""]
    out += ["## MUDD / FeatureGate ΔNLL ratio (same size and steps)\n",
            "| size | steps | " + " | ".join(
                " / ".join(dict.fromkeys(ab)) for ab in zip(*(_labels(rows, v) for v in FAMILIES)))
            + " |",
            "|---" * (len(CONDITIONS) + 2) + "|"]
    for r in ratios(rows):
        out.append(f"| {r['size']} | {r['steps']} | " + " | ".join(
            "—" if r["ratio"].get(c) is None else _ratio(r["ratio"][c]) for c in CONDITIONS)
            + " |")
    paper_ratio = " | ".join(
        _ratio(PAPER["mudd"]["conditions"][c] / PAPER["feature_gate"]["conditions"][c])
        if c in PAPER["feature_gate"]["conditions"] else "—" for c in CONDITIONS)
    out += [f"| paper: 1.4B / 76M | | {paper_ratio} |", ""]
    out += ["## Test bits/byte of every finished training run\n",
            "(the longest setting, tiny at 5000 steps, holds dense and layer_static beside "
            "FeatureGate and MUDD)\n",
            "| size | variant | steps | tokens | " +
            " | ".join(f"seed {s}" for s in data["seeds"]) + " | mean | device |",
            "|---" * (len(data["seeds"]) + 6) + "|"]
    for r in rows:
        if not r["test_bpb"]:
            continue
        vals = [r["test_bpb"].get(s) for s in data["seeds"]]
        mean = sum(r["test_bpb"].values()) / len(r["test_bpb"])
        out.append(f"| {r['size']} | {r['variant']} | {r['steps']} | {r['tokens']:,} | " +
                   " | ".join("—" if v is None else f"{v:.4f}" for v in vals) +
                   f" | {mean:.4f} | {_where(r)} |")
    partial = [(r, s, a) for r in rows for s, a in sorted(r.get("seed_audits", {}).items())]
    if partial:
        out += ["", "## Seeds audited, their row not yet complete\n",
                "(each seed audited alone: its interval is over evaluation windows and "
                "reassignments, not seeds; the row's checkpoint-level CI comes once all "
                f"{len(data['seeds'])} are audited)\n",
                "| family | size | steps | seed | test bits/byte | " + " | ".join(
                    " / ".join(dict.fromkeys(ab)) for ab in zip(*(
                        _labels(rows, v) for v in dict.fromkeys(r["variant"]
                                                                for r, _, _ in partial))))
                + " | retention | device |",
                "|---" * (len(CONDITIONS) + 7) + "|"]
        for r, s, a in partial:
            out.append(f"| {r['family']} | {r['size']} | {r['steps']} | {s} | "
                       f"{r['test_bpb'][s]:.4f} | " +
                       " | ".join(_cell(a["conditions"].get(c)) for c in CONDITIONS) +
                       f" | {_cell(a['retention'], '{:.1%}')} | {_where(r)} |")
    left = [r["name"] for r in rows if (r["audited"] and r["audit"] is None) or
            len(r["test_bpb"]) < len(data["seeds"])]
    out += ["", "Not finished yet: " + (", ".join(left) if left else "nothing") + "."]
    carried = {(r["carried"]["generated"], r["carried"]["command"]): [] for r in rows
               if r.get("carried")}
    for r in rows:
        if r.get("carried"):
            carried[(r["carried"]["generated"], r["carried"]["command"])].append(r["name"])
    for (generated, cmd), names in carried.items():
        out += ["", f"† Carried from the report of {generated} (`{cmd}`), whose runs are not "
                f"under this one's --runs: {', '.join(names)}."]
    return "\n".join(out) + "\n"


def _where(r) -> str:
    """The row's devices, marked † when the row was carried from an earlier report."""
    return ", ".join(r["devices"]) + (" †" if r.get("carried") else "")


def _labels(rows, variant) -> list:
    """The audit's own condition labels for a family (LayerMean, StaticMixMean, ...)."""
    for r in rows:
        for a in [r["audit"], *r.get("seed_audits", {}).values()]:
            if r["variant"] == variant and a:
                return [(a["conditions"].get(c) or {}).get("label") or c for c in CONDITIONS]
    return list(CONDITIONS)


def ratios(rows) -> list:
    """MUDD ΔNLL / FeatureGate ΔNLL per condition, for every (size, steps) both audited."""
    audited = {(r["variant"], r["size"], r["steps"]): r["audit"] for r in rows if r["audit"]}
    out = []
    for (variant, size, steps), fg in audited.items():
        mudd = audited.get(("mudd", size, steps))
        if variant != "feature_gate" or mudd is None:
            continue
        ratio = {}
        for c in CONDITIONS:
            a, b = fg["conditions"].get(c), mudd["conditions"].get(c)
            if a and b and a["estimate"] and a["estimate"] > 0:
                ratio[c] = b["estimate"] / a["estimate"]
        out.append(dict(size=size, steps=steps, ratio=ratio))
    return out


# each condition its colour and its marker (legible in grey print); sizes by fill and line
CONDITION_STYLE = dict(zip(CONDITIONS, zip(("C0", "C1", "C2", "C3", "C4", "C5"),
                                           ("o", "s", "^", "D", "v", "P"))))
SIZE_STYLE = {"tiny": dict(linestyle="-", filled=True), "large": dict(linestyle="--",
                                                                       filled=False)}


def _interval(values, key_lo="ci_low", key_hi="ci_high", scale=1.0):
    """(estimates, lower and upper error lengths) of ``values`` (rows with an estimate and
    CI ends; a missing end draws no whisker)."""
    est = [scale * v["estimate"] if v.get("estimate") is not None else float("nan")
           for v in values]
    lo = [e - scale * v[key_lo] if v.get(key_lo) is not None else 0.0
          for e, v in zip(est, values)]
    hi = [scale * v[key_hi] - e if v.get(key_hi) is not None else 0.0
          for e, v in zip(est, values)]
    return est, lo, hi


def _tokens_axis(ax, tokens) -> None:
    ax.set_xscale("log")
    ax.set_xticks(sorted(set(tokens)), [f"{t / 1e6:.1f}M" for t in sorted(set(tokens))])
    ax.minorticks_off()
    ax.set_xlabel("training tokens")
    fit(ax, "x", tokens, margin=0.08)


@styled
def plot_family(data: dict, variant: str):
    """ΔNLL of each condition (symlog) and static retention against training tokens: a
    condition is a colour and a marker, a size a fill and a line style, the paper's values
    dotted lines ending in the condition's hollow marker; one legend below both panels."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    from dynjax.audit.report import dnll_axis
    fig = Figure(figsize=(12, 5.6), layout="constrained")
    ax, ax_r = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    paper = data["paper"][variant]
    rows = [r for r in data["rows"] if r["variant"] == variant and r["audit"]]
    partial = [r for r in data["rows"] if r["variant"] == variant and not r["audit"]
               and r.get("seed_audits")]
    dnll_axis(ax, "y", "ΔNLL vs Correct (nats/token, 95% CI)")
    if not rows:
        ax.text(0.5, 0.5, "no audited row yet", transform=ax.transAxes, ha="center")
    ys, rets, tokens = [], [], [r["tokens"] for r in rows + partial]
    for size, st in SIZE_STYLE.items():
        pts = sorted((r for r in rows if r["size"] == size), key=lambda r: r["tokens"])
        if not pts:
            continue
        x = [r["tokens"] for r in pts]
        for c, (color, marker) in CONDITION_STYLE.items():
            cs = [r["audit"]["conditions"].get(c) or {} for r in pts]
            if all(v.get("estimate") is None for v in cs):
                continue
            y, lo, hi = _interval(cs)
            ys += [y, [a - b for a, b in zip(y, lo)], [a + b for a, b in zip(y, hi)]]
            ax.errorbar(x, y, yerr=[lo, hi], marker=marker, color=color, capsize=3,
                        linestyle=st["linestyle"], mfc=color if st["filled"] else "white")
        y, lo, hi = _interval([r["audit"]["retention"] for r in pts], scale=100)
        rets += [y, [a - b for a, b in zip(y, lo)], [a + b for a, b in zip(y, hi)]]
        ax_r.errorbar(x, y, yerr=[lo, hi], marker="o", color="k", capsize=3,
                      linestyle=st["linestyle"], mfc="k" if st["filled"] else "white")
    for r in partial:   # a row not yet complete: each audited seed alone, unconnected
        for a in r["seed_audits"].values():
            for c, (color, marker) in CONDITION_STYLE.items():
                v = (a["conditions"].get(c) or {}).get("estimate")
                if v is not None:
                    ys.append([v])
                    ax.plot(r["tokens"], v, marker=marker, mfc="none", color=color,
                            linestyle="none", alpha=0.6)
            rets.append([100 * a["retention"]["estimate"]])
            ax_r.plot(r["tokens"], rets[-1][0], marker="o", mfc="none", color="k",
                      linestyle="none", alpha=0.6)
    refs = ax.get_yaxis_transform()   # x in axes fractions, y in data
    for c, v in paper["conditions"].items():
        color, marker = CONDITION_STYLE[c]
        ax.plot([0.0, 0.96], [v, v], color=color, linestyle=":", linewidth=1, transform=refs)
        ax.plot([0.96], [v], marker=marker, color=color, mfc="white", transform=refs)
    ax.axhline(0.002, color="grey", linestyle="-.", linewidth=1)
    fit(ax, "y", ys, include=[*paper["conditions"].values(), 0.002, 0.0])
    _tokens_axis(ax, tokens)
    ax.set_title(f"{FAMILIES[variant][1]}: ΔNLL per condition")
    ax_r.axhline(100 * paper["retention"], color="k", linestyle=":")
    ax_r.axhline(95, color="grey", linestyle="-.")
    fit(ax_r, "y", rets, include=[100 * paper["retention"], 95])
    _tokens_axis(ax_r, tokens)
    ax_r.set(ylabel="static retention (%, 95% CI)", title="static profile's retention of the gap")
    labels = _labels(data["rows"], variant)
    handles = [Line2D([], [], color=color, marker=marker, label=label)
               for (color, marker), label in zip(CONDITION_STYLE.values(), labels)]
    handles += [Line2D([], [], color="k", marker="o", linestyle=st["linestyle"],
                       mfc="k" if st["filled"] else "white", label=f"{size} model")
                for size, st in SIZE_STYLE.items() if any(r["size"] == size for r in rows)]
    if partial:
        handles.append(Line2D([], [], color="k", marker="o", mfc="none", linestyle="none",
                              alpha=0.6, label="one seed of a row not yet complete"))
    handles += [Line2D([], [], color="k", linestyle=":", marker="o", mfc="white",
                       label=f"{paper['model']} (paper): dotted; on the left, its marker"),
                Line2D([], [], color="grey", linestyle="-.",
                       label="criteria: static ΔNLL < 0.002, retention > 95%")]
    fig.legend(handles=handles, loc="outside lower center", ncol=4)
    return fig


def write_report(runs: pathlib.Path, out: pathlib.Path, argv, carry: bool = True) -> None:
    """table.md, results.json, featuregate.png, mudd.png into ``out``, as one atomic unit
    (everything else in ``out`` kept: its README, the archives); rows the report already in
    ``out`` holds more of are carried forward (``carry_forward``)."""
    import tempfile

    from dynjax.audit.report import _move_into_place
    from dynjax.jsonio import write_json_atomic

    if not runs.is_dir():
        raise SystemExit(f"fca_sweep.py: error: --runs={runs} does not exist")
    data = collect(runs)
    if carry:
        data = carry_forward(data, _read_json(out / "results.json"))
    if not any(r["test_bpb"] for r in data["rows"]):
        raise SystemExit(f"fca_sweep.py: error: no finished run under {runs} yet; run the "
                         "sweep first (`--plan` lists what is left)")
    command = portable("python experiments/fca_sweep.py " + shlex.join(argv))
    data = portable(dict(data, command=command, versions=versions(),
                         generated=time.strftime("%Y-%m-%d %H:%M:%S"),
                         ratios=ratios(data["rows"])))   # no absolute machine path
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    tmp.chmod(0o755)
    write_json_atomic(tmp / "results.json", data)
    (tmp / "table.md").write_text(render_table(data, command))
    for variant, name in (("feature_gate", "featuregate.png"), ("mudd", "mudd.png")):
        save(plot_family(data, variant), tmp / name)
    if out.is_dir():   # what the report does not write (README.md, archive/) stays
        import shutil
        for entry in out.iterdir():
            if not (tmp / entry.name).exists():
                (shutil.copytree if entry.is_dir() else shutil.copy2)(entry, tmp / entry.name)
    _move_into_place(tmp, out)
    print(f"wrote {out}/table.md, results.json, featuregate.png, mudd.png")


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
    p.add_argument("--fresh", action="store_true",
                   help="--report from --runs alone, not carrying forward the rows of the "
                        "report already in --out")
    p.add_argument("--rows", default=None,
                   help="plan only rows whose name contains one of these comma-separated "
                        "parts, e.g. --rows=large (a device call for the larger size)")
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)),
                   help="do only these comma-separated seeds' runs and audits, e.g. one "
                        "process per seed on a machine with cores to spare (default: all)")
    p.add_argument("--export", metavar="FILE.tgz",
                   help="write the runs and audits without checkpoints to FILE.tgz and exit")
    p.add_argument("--import", dest="import_", metavar="FILE.tgz",
                   help="add the runs and audits of an --export to --runs and exit")
    args = p.parse_args(argv)
    runs = pathlib.Path(args.runs)
    try:
        seeds = tuple(sorted({int(x) for x in args.seeds.split(",") if x.strip()}))
    except ValueError:
        seeds = ()
    if not seeds or not set(seeds) <= set(SEEDS):
        p.error(f"--seeds={args.seeds}: give comma-separated seeds from {list(SEEDS)}")
    if args.export:
        export_runs(runs, pathlib.Path(args.export))
        print(f"wrote {args.export}")
        return
    if args.import_:
        if not pathlib.Path(args.import_).is_file():
            raise SystemExit(f"fca_sweep.py: error: --import={args.import_} is not a file")
        added = import_runs(pathlib.Path(args.import_), runs)
        print(f"added {len(added)}: {', '.join(added)}" if added else "nothing new to add")
        return
    if args.plan:
        left = work(runs, args.rows, seeds)
        print("\n".join(describe(i) for i in left) or "nothing left: the sweep is complete")
        return
    if args.report:
        write_report(runs, pathlib.Path(args.out), argv if argv is not None else sys.argv[1:],
                     carry=not args.fresh)
        return
    from dynjax.audit.run import AuditError, ReplayError
    from dynjax.data.text import DataError
    from dynjax.train.preempt import Preempted, exit_status

    try:
        left = run_sweep(runs, None if args.budget_minutes is None else args.budget_minutes * 60,
                         rows=args.rows, seeds=seeds)
    except (DataError, AuditError, ReplayError, ValueError) as e:
        raise SystemExit(f"fca_sweep.py: error: {e}") from None
    except Preempted as stopped:   # SIGTERM/SIGINT during a run: saved; rerun to continue
        print(f"fca_sweep.py: {stopped}; rerun the sweep to continue", file=sys.stderr)
        sys.exit(exit_status(stopped.signum))
    print("sweep complete" if not left else f"{len(left)} items left; rerun to continue")


if __name__ == "__main__":
    main()
