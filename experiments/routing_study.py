"""Is MoE routing a token-id lookup or a function of context? The routing study (issue 48).

    python experiments/routing_study.py --runs=runs/routing_study               # everything, resumable
    python experiments/routing_study.py --runs=runs/routing_study --seeds=1     # one seed's items
    python experiments/routing_study.py --runs=runs/routing_study --plan        # what is done / left
    python experiments/routing_study.py --runs=/tmp/rs_check --check=5          # each arm, 5 steps
    python experiments/routing_study.py --runs=/tmp/rs_check --check=5 --arms=hash,mhc
    python experiments/routing_study.py --runs=runs/routing_study --report      # results/routing_study/

The arms are configs/routing_study.py's (``ARMS``; ``--arms`` picks some), three seeds
each, at the FCA sweep's tiny size (4 layers, d = 128, ``embedded_large``, batch 32 x 128,
1500 steps), then the learned routers at its larger size (``softmax_topk_large``,
``deepseek_sigmoid_large``: 8 layers, d = 256, the same 1500 steps). For each trained seed,
in order, what ``routing_study.study(arm)`` gives the arm:

1. ``audit``: audit.py's protocol (configs/audit_tiny.py; 256 calibration and 256
   evaluation windows, R = 10) into RUNS/audit/ARM_sSEED with the arm's conditions: the
   routers' (correct, cross_input, token_shuffle, token_identity, expert_relabel,
   weights_flat, static_profile, structure_removed; the hash router without weights_flat)
   or, for the attention gates and mHC, the FeatureGate / MUDD ones (correct, cross_input,
   token_shuffle, static_profile, structure_removed); the arm's three seeds combined
   (audit.py --combine) into RUNS/audit/ARM;
2. ``layers`` (routers): the per-layer table (dynjax.audit.layer_conditions): ΔNLL of
   cross_input and token_identity applied to one layer's router at a time, with paired
   window CIs;
3. ``experts`` (learned routers): causal expert importance against REAP saliency
   (dynjax.audit.expert_importance.compare): ΔNLL of removing each expert with CIs, the
   Spearman correlation per layer, the bits/byte cost of pruning the bottom 25% / 50%.

4. ``hf`` (seed 0 of the arms with an HF twin: softmax_topk): the run exported as a Hugging Face directory (``python -m
   dynjax.export``) into RUNS/hf/ARM_s0 and audited through it (audit.py --hf's path, the
   same windows: the byte tokenizer gives the bytes); the record says whether every
   condition's ΔNLL equals the run directory's audit (a 6-step run of the arm, 8 + 8 windows,
   R = 2: all eight conditions' ΔNLL bitwise equal).

Each seed's results go to OUT/seeds/ARM_sSEED.json as soon as they exist (commit them: run
directories do not outlive their machine); ``--report`` combines the seeds into
OUT/per_layer.json, OUT/expert_importance.json and OUT/table.md: per layer, ΔNLL(cross-input)
and ΔNLL(token-identity) as means over seeds with seed-level CIs, their difference, and the
share of the cross-input effect token identity recovers (1 - ΔTI / ΔCI, stats.retention_ci).
Rerunning skips finished items and resumes an interrupted training from its checkpoint.
"""
from __future__ import annotations

from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from dynjax.figures import save, styled  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
SEEDS = (0, 1, 2)
OUT = ROOT / "results" / "routing_study"
AUDIT = dict(calib_windows=256, eval_windows=256, reassignments=10)
STUDY = dict(eval_windows=128, layer_reassignments=5)   # per-layer table, expert importance
EXPERT_KEYS = ("spearman", "pruning", "reap_saliency", "causal_delta_nll", "causal_ci_low",
               "causal_ci_high")   # expert_importance.json: the correlations and the figure's points
SELECTED = []   # --arms: the arms to work on (empty: every arm)


def arms():
    from dynjax.configs import routing_study
    return tuple(a for a in routing_study.ARMS if not SELECTED or a in SELECTED)


def study(arm: str) -> dict:
    from dynjax.configs import routing_study
    return routing_study.study(arm)


def train_config(arm: str, seed: int, steps: int | None = None):
    from dynjax.configs import routing_study

    c = routing_study.get_config(arm)
    c.seed = seed
    if steps is not None:      # --check: a handful of steps
        c.train.update(dict(steps=steps, warmup_steps=1, log_every=1, eval_every=steps,
                            ckpt_every=steps))
        c.eval.update(dict(windows=32, decode_check_windows=0))
    else:
        c.train.log_every = 50
    return c


def run_dir(runs: pathlib.Path, arm: str, seed: int) -> pathlib.Path:
    return runs / f"{arm}_s{seed}"


def seed_file(out: pathlib.Path, arm: str, seed: int) -> pathlib.Path:
    return out / "seeds" / f"{arm}_s{seed}.json"


def trained(path: pathlib.Path) -> bool:
    ev = path / "eval.json"
    return ev.exists()


def audit_config(arm: str = "softmax_topk"):
    from dynjax.configs import audit_tiny

    c = audit_tiny.get_config()
    c.conditions = ",".join(study(arm)["conditions"])
    c.data.calib_windows = AUDIT["calib_windows"]
    c.data.eval_windows = AUDIT["eval_windows"]
    c.reassignments = AUDIT["reassignments"]
    return c


def _read(path: pathlib.Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def work(runs: pathlib.Path, out: pathlib.Path, seeds=SEEDS) -> list:
    """What is left: (kind, arm, seed) in order, each seed's analyses right after it trains."""
    items = []
    for arm in arms():
        for seed in seeds:
            done = _read(seed_file(out, arm, seed))
            if not trained(run_dir(runs, arm, seed)) and not done:
                items.append(("train", arm, seed))
            todo = study(arm)
            for kind in ("audit", "layers", "experts", "hf"):
                if kind != "audit" and not todo[kind] or kind == "hf" and seed != 0:
                    continue
                if kind not in done:
                    items.append((kind, arm, seed))
        if all((runs / "audit" / f"{arm}_s{s}" / "results.json").exists() for s in SEEDS) \
                and not (runs / "audit" / arm / "results.json").exists():
            items.append(("combine", arm, None))
    return items


def _target(path: pathlib.Path):
    """(model, params, evaluation windows) of a trained run: the audit's windows (test split)."""
    from dynjax.audit.targets import open_target

    t = open_target(str(path))
    _, ev, _ = t.windows(audit_config().data, 1, STUDY["eval_windows"])
    return t.model, t.params, ev


def _small(tree):
    """A results entry without its per-window lists (they stay in the audit directory)."""
    if isinstance(tree, dict):
        return {k: _small(v) for k, v in tree.items()
                if not (isinstance(v, list) and len(v) > 32)}
    return tree


def analyse(kind: str, path: pathlib.Path, runs: pathlib.Path, arm: str, seed: int) -> dict:
    from dynjax.audit import expert_importance as ei
    from dynjax.audit import layer_conditions
    from dynjax.audit import run as audit_run

    if kind == "audit":
        d = runs / "audit" / path.name
        res = audit_run.audit_from_config(audit_config(arm), [str(path)], out=str(d),
                                          progress=False, log=lambda *a: None)
        return {"pooled": {name: _small(r) for name, r in res["conditions"].items()},
                "audit_dir": str(d.relative_to(runs))}
    if kind == "hf":
        return hf_audit(path, runs)
    model, params, ev = _target(path)
    if kind == "layers":
        rec = ei.Recorded(model, params, ev)
        delta = layer_conditions.per_layer(rec, reassignments=STUDY["layer_reassignments"],
                                           seed=seed)
        return {"per_layer": layer_conditions.summarize(delta),
                "mean_delta": {k: v.mean(axis=(1, 2)).tolist() for k, v in delta.items()}}
    return ei.compare(model, params, ev, seed=seed)


def hf_audit(path: pathlib.Path, runs: pathlib.Path) -> dict:
    """Export the run, audit the HF directory as audit.py --hf does, compare with the run's
    own audit (RUNS/audit/RUN): every condition's ΔNLL equal?"""
    from dynjax import export
    from dynjax.audit import run as audit_run
    from dynjax.runs import rundir

    hf_dir = runs / "hf" / path.name
    if not hf_dir.exists():
        export.export_run(str(path), str(hf_dir))
    c = audit_config()
    run_cfg = rundir.read_config(str(path))
    c.data.source, c.data.seq_len = run_cfg.data.source, int(run_cfg.data.seq_len)
    c.hf.dtype = "float32"
    res = audit_run.audit_from_config(c, hf_dir=str(hf_dir), out=str(runs / "audit" / (
        path.name + "_hf")), progress=False, log=lambda *a: None)
    own = json.loads((runs / "audit" / path.name / "results.json").read_text())["conditions"]
    pairs = {k: (own[k].get("estimate"), r.get("estimate")) for k, r in res["conditions"].items()}
    return {"hf_dir": str(hf_dir.relative_to(runs)), "estimates": pairs,
            "same_table": all(a == b for a, b in pairs.values())}


def run_study(runs: pathlib.Path, out: pathlib.Path, seeds=SEEDS, log=print) -> None:
    from dynjax.audit import run as audit_run
    from dynjax.jsonio import command_line, write_json_atomic
    from dynjax.train.loop import train

    runs.mkdir(parents=True, exist_ok=True)
    for kind, arm, seed in work(runs, out, seeds):
        log(f"[{time.strftime('%H:%M:%S')}] {kind} {arm} seed {seed}")
        start = time.monotonic()
        if kind == "combine":
            audit_run.combine_dirs([str(runs / "audit" / f"{arm}_s{s}") for s in SEEDS],
                                   out=str(runs / "audit" / arm))
            continue
        path = run_dir(runs, arm, seed)
        if kind == "train":
            result = train(train_config(arm, seed), str(path), progress=False)
            log(f"  test {result['test']['bpb']:.4f} bits/byte")
            continue
        record = _read(seed_file(out, arm, seed))
        if "test_bpb" not in record:
            record.update(arm=arm, seed=seed, test_bpb=_read(path / "eval.json").get("test", {})
                          .get("bpb"), command=command_line(), run=path.name)
        record[kind] = analyse(kind, path, runs, arm, seed)
        record.setdefault("seconds", {})[kind] = time.monotonic() - start
        seed_file(out, arm, seed).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(seed_file(out, arm, seed), record)


def report(out: pathlib.Path) -> dict:
    """Combine the seeds' files: per arm and layer, ΔNLL(cross_input) and ΔNLL(token_identity)
    over seeds (seed-level CIs), their difference, the share token identity recovers; the
    Spearman correlations and pruning costs per seed."""
    from dynjax.audit import stats
    from dynjax.jsonio import command_line, write_json_atomic, write_text_atomic

    table, experts = {}, {}
    lines = ["# Routing study: token identity vs context, per layer\n",
             "Intervals over seeds (two seeds: their range); an arm with one seed: that "
             "seed's intervals over windows.\n",
             "| arm | layer | seeds | ΔNLL cross-input [CI] | ΔNLL token-identity [CI] | "
             "difference TI - CI [CI] | share TI recovers [CI] |", "|---|---|---|---|---|---|---|"]
    for arm in (a for a in arms() if study(a)["layers"]):
        files = [_read(seed_file(out, arm, s)) for s in SEEDS]
        files = [f for f in files if "layers" in f]
        if not files:
            continue
        ci = np.array([f["layers"]["mean_delta"]["cross_input"] for f in files])
        ti = np.array([f["layers"]["mean_delta"]["token_identity"] for f in files])
        rows = []
        for layer in range(ci.shape[1]):
            if len(files) > 2:     # intervals over seeds
                row = {"cross_input": stats.bootstrap_ci(ci[:, layer]),
                       "token_identity": stats.bootstrap_ci(ti[:, layer]),
                       "difference": stats.bootstrap_ci(ti[:, layer] - ci[:, layer]),
                       "share_recovered": stats.retention_ci(ti[:, layer], ci[:, layer])}
            else:   # one seed: its intervals over windows; two: their range (a bootstrap
                #     over two values is no interval); the share without one
                deltas = (("cross_input", ci[:, layer]), ("token_identity", ti[:, layer]),
                          ("difference", ti[:, layer] - ci[:, layer]))
                row = ({k: files[0]["layers"]["per_layer"][layer][k] for k, _ in deltas}
                       if len(files) == 1 else {k: _seed_range(v) for k, v in deltas})
                row["share_recovered"] = {"estimate": float(1 - ti[:, layer].mean()
                                                            / ci[:, layer].mean()),
                                          "ci_low": None, "ci_high": None}
            row.update(layer=layer, seeds=len(files))
            rows.append(row)
            fmt = lambda s: f"{s['estimate']:.4f} [{s['ci_low']:.4f}, {s['ci_high']:.4f}]"
            share = row["share_recovered"]
            share_ci = (f" [{share['ci_low']:.3f}, {share['ci_high']:.3f}]"
                        if share["ci_low"] is not None else "")
            lines.append(f"| {arm} | {layer} | {len(files)} | {fmt(row['cross_input'])} | "
                         f"{fmt(row['token_identity'])} | {fmt(row['difference'])} | "
                         f"{share['estimate']:.3f}{share_ci} |")
        table[arm] = rows
        experts[arm] = [{"seed": f["seed"], **{k: f["experts"][k] for k in EXPERT_KEYS
                                                if k in f["experts"]}} for f in
                        (_read(seed_file(out, arm, s)) for s in SEEDS) if "experts" in f]
    whole = whole_model(out)
    lines += ["", "# Whole model, per arm (all coefficient sites at once)\n",
              "ΔNLL nats/token, mean over seeds; three seeds: a bootstrap 95% CI over the "
              "seeds (coarse: three values); one seed: its CI over windows; test bits/byte "
              "per seed.\n", *whole.pop("_lines")]
    write_json_atomic(out / "arms.json", {"command": command_line(), "arms": whole})
    write_json_atomic(out / "per_layer.json", {"command": command_line(), "arms": table})
    write_json_atomic(out / "expert_importance.json", {"command": command_line(),
                                                       "arms": experts})
    write_text_atomic(out / "table.md", "\n".join(lines) + "\n")
    if table:
        save(plot_layers({"arms": table}), out / "per_layer.png")
    if any("reap_saliency" in s for seeds in experts.values() for s in seeds):
        save(plot_experts({"arms": experts}), out / "expert_importance.png")
    return table


@styled
def plot_layers(data: dict):
    """per_layer.json drawn: per router arm, each layer's ΔNLL under cross-input and under
    token identity with their intervals (over seeds; one seed: over windows)."""
    from matplotlib.figure import Figure

    from dynjax.figures import dot_ci, fit

    arms_ = list(data["arms"])
    fig = Figure(figsize=(3.0 * len(arms_) + 0.6, 2.9), layout="constrained")
    axes = fig.subplots(1, len(arms_), sharey=True, squeeze=False)[0]
    for ax, arm in zip(axes, arms_):
        rows = data["arms"][arm]
        labels = [f"layer {r['layer']}" for r in rows]
        ends = []
        for name, color, marker, offset in (("cross_input", "C0", "o", -0.12),
                                            ("token_identity", "C1", "s", 0.12)):
            est, lo, hi = ([r[name][k] for r in rows] for k in ("estimate", "ci_low", "ci_high"))
            dot_ci(ax, labels, est, lo, hi, color=color, marker=marker, offset=offset,
                   label=name.replace("_", " "))
            ends += [est, lo, hi]
        ax.axvline(0.0, color="0.6", lw=0.8)
        fit(ax, "x", ends, include=(0.0,))
        ax.set_xlabel("ΔNLL (nats/token)")
        ax.set_title(f"{arm} ({rows[0]['seeds']} seed{'s' * (rows[0]['seeds'] > 1)})")
    axes[0].set_ylim(len(axes[0].get_yticks()) - 0.5, -0.5)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=2)
    return fig


@styled
def plot_experts(data: dict):
    """expert_importance.json drawn: per learned-router arm, every expert's REAP saliency
    against the ΔNLL of removing it (interval over windows), a colour per layer, a marker
    per seed; the Spearman ρ per layer of seed 0 in the title."""
    from matplotlib.figure import Figure

    from dynjax.figures import fit

    arms_ = [a for a, seeds in data["arms"].items() if any("reap_saliency" in s for s in seeds)]
    fig = Figure(figsize=(3.6 * len(arms_) + 0.4, 3.4), layout="constrained")
    axes = fig.subplots(1, len(arms_), squeeze=False)[0]
    for ax, arm in zip(axes, arms_):
        seeds = [s for s in data["arms"][arm] if "reap_saliency" in s]
        xs, ys = [], []
        for s, marker in zip(seeds, "os^"):
            for layer, (x, y, lo, hi) in enumerate(zip(
                    s["reap_saliency"], s["causal_delta_nll"], s["causal_ci_low"],
                    s["causal_ci_high"])):
                y, lo, hi = (np.asarray(v, float) for v in (y, lo, hi))
                ax.errorbar(x, y, yerr=[y - lo, hi - y], fmt=marker, color=f"C{layer}",
                            ms=3.5, capsize=0, elinewidth=0.6,
                            label=f"layer {layer}" if s is seeds[0] else None)
                xs.append(x)
                ys += [lo, hi]
        fit(ax, "x", xs, include=(0.0,))
        fit(ax, "y", ys, include=(0.0,))
        rho = ", ".join(f"{r['rho']:.2f}" for r in seeds[0]["spearman"])
        ax.set_title(f"{arm}\nSpearman ρ by layer (seed 0)\n{rho}")
        ax.set_xlabel("REAP saliency")
        ax.set_ylabel("ΔNLL removing the expert")
    handles = {}     # every layer of every arm (the larger size has twice the tiny's)
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    labels = sorted(handles, key=lambda label: int(label.split()[-1]))
    fig.legend([handles[label] for label in labels], labels, loc="outside lower center",
               ncols=len(labels))
    return fig


def _seed_range(values) -> dict:
    """Two seeds' mean with their range as the interval (``ci_method`` says so)."""
    return {"estimate": float(np.mean(values)), "ci_low": float(np.min(values)),
            "ci_high": float(np.max(values)), "ci_method": "range of the two seeds"}


def _over_seeds(values):
    """Three or more seeds: the seeds as checkpoints (bootstrap CI of their mean, the exact
    sign-flip p with its floor); two: their range; one: None (its windows' CI is beside it)."""
    from dynjax.audit import stats
    if len(values) >= 3:
        return stats.summarize_checkpoints(values)
    return _seed_range(values) if len(values) == 2 else None


def whole_model(out: pathlib.Path) -> dict:
    """Per arm with audited seeds: each condition's ΔNLL (the whole-model audit, every site
    at once) per seed, its mean and its interval over seeds (:func:`_over_seeds`), the share
    of the structure's effect a static profile keeps (``1 - static_profile /
    structure_removed``, per seed and, with three seeds, with its paired CI), and test
    bits/byte per seed; ``_lines``: the markdown table (conditions as columns, an arm a row)."""
    from dynjax.audit import stats

    arms_out, conditions = {}, []
    for arm in arms():
        files = [f for f in (_read(seed_file(out, arm, s)) for s in SEEDS) if "audit" in f]
        if not files:
            continue
        pooled = [f["audit"]["pooled"] for f in files]
        names = [c for c in pooled[0] if c != "correct"]
        conditions += [c for c in names if c not in conditions]
        per_seed = {c: [p[c]["estimate"] for p in pooled] for c in names}
        arms_out[arm] = {"seeds": [f["seed"] for f in files],
                         "test_bpb": [f["test_bpb"] for f in files],
                         "conditions": {c: {"per_seed": v, "mean": float(np.mean(v)),
                                            "ci_one_seed": [pooled[0][c]["ci_low"],
                                                            pooled[0][c]["ci_high"]]
                                            if len(pooled) == 1 else None,
                                            "over_seeds": _over_seeds(v)}
                                        for c, v in per_seed.items()}}
        if {"static_profile", "structure_removed"} <= set(names):
            s, r = np.array(per_seed["static_profile"]), np.array(per_seed["structure_removed"])
            arms_out[arm]["static_keeps"] = {
                "definition": "1 - static_profile / structure_removed (ΔNLL, whole model)",
                "per_seed": list(1 - s / r),
                "over_seeds": stats.retention_ci(s, r) if len(s) >= 3 else None}
    lines = ["| arm | seeds | test bits/byte | " + " | ".join(conditions) + " |",
             "|---|---|---|" + "---|" * len(conditions)]
    for arm, a in arms_out.items():
        cells = []
        for c in conditions:
            v = a["conditions"].get(c)
            ci = (v["ci_one_seed"] or ([v["over_seeds"]["ci_low"], v["over_seeds"]["ci_high"]]
                                       if len(a["seeds"]) >= 3 else None)) if v else None
            cells.append("—" if v is None else f"{v['mean']:.3f}" + (
                f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""))
        bpb = " / ".join(f"{b:.4f}" for b in a["test_bpb"])
        lines.append(f"| {arm} | {len(a['seeds'])} | {bpb} | " + " | ".join(cells) + " |")
    keeps = [(arm, a["static_keeps"]) for arm, a in arms_out.items() if "static_keeps" in a]
    if keeps:
        lines += ["", "Share of the structure's effect a static profile keeps "
                  "(1 - static_profile / structure_removed), per seed; three seeds: the paired "
                  "bootstrap CI over seeds.", ""]
        for arm, k in keeps:
            o = k["over_seeds"]
            lines.append(f"- {arm}: " + " / ".join(f"{x:.3f}" for x in k["per_seed"]) + (
                f"; {o['estimate']:.3f} [{o['ci_low']:.3f}, {o['ci_high']:.3f}]" if o else ""))
    arms_out["_lines"] = lines
    return arms_out


def check(runs: pathlib.Path, steps: int, log=print) -> dict:
    """Each arm trained ``steps`` steps (seed 0): the commands work; seconds per step
    after the first (compilation) step, from metrics.jsonl's timestamps where present."""
    from dynjax.train.loop import train

    out = {}
    for arm in arms():
        path = run_dir(runs, arm, 0)
        t0 = time.monotonic()
        result = train(train_config(arm, 0, steps), str(path), progress=False)
        out[arm] = {"seconds": time.monotonic() - t0, "test_bpb": result["test"]["bpb"]}
        log(f"{arm}: {steps} steps in {out[arm]['seconds']:.0f} s, test "
            f"{result['test']['bpb']:.3f} bits/byte")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", required=True, help="where the run directories and audits go")
    p.add_argument("--out", default=str(OUT), help="the results folder (committed)")
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    p.add_argument("--plan", action="store_true", help="list what is left and exit")
    p.add_argument("--report", action="store_true", help="combine the seeds' results")
    p.add_argument("--check", type=int, default=0, help="train each arm this many steps only")
    p.add_argument("--arms", default="", help="comma-separated arms (default: every arm)")
    args = p.parse_args(argv)
    from dynjax.configs import routing_study
    SELECTED[:] = [a for a in args.arms.split(",") if a]
    unknown = [a for a in SELECTED if a not in routing_study.ARMS]
    if unknown:
        p.error(f"--arms: unknown {unknown}; choose from {list(routing_study.ARMS)}")
    runs, out = pathlib.Path(args.runs), pathlib.Path(args.out)
    seeds = tuple(int(s) for s in args.seeds.split(",") if s)
    if args.check:
        check(runs, args.check)
    elif args.plan:
        for item in work(runs, out, seeds):
            print(*item)
    elif args.report:
        report(out)
    else:
        run_study(runs, out, seeds)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
