"""Converting a trained dense model: to Mixture-of-Depths by continual pre-training, to MoE by
sparse upcycling, each against training from scratch and dense trained on, at equal FLOPs.

    nice -n 5 .venv/bin/python experiments/conversion.py [--dense-steps 600] [--seeds 0]

Sizes are configs/mod_tiny.py's (4 blocks, d=128, T=128, batch 32). Per seed:

- ``dense``: the dense twin for ``--dense-steps`` N steps: the source of every conversion;
- ``mod_conv_X``: ``train.init_from`` the dense run, MoD with c = 0.125 in every other block
  (routers fitted: dynjax/train/convert.py), trained X% of N more steps (X = 5, 10);
- ``moe_up_X``: the dense MLPs upcycled into 4 experts (configs/moe_tiny.py: top-1, capacity
  factor 1.25), trained X% of N more steps;
- ``dense_on_mod_X`` / ``dense_on_moe_X``: the dense run trained on (init_from, a fresh
  optimizer like the conversions) for the FLOPs that X% of N steps of MoD / MoE cost;
- ``mod_scratch`` / ``moe_scratch``: trained from scratch for the whole budget of the 10%
  conversion (N dense steps plus 0.1 N converted steps, in FLOPs).

Training FLOPs per step: XLA's cost analysis of the compiled train step (unrolled layers,
every op: routers, predictor, dispatch). Continuations (conversions and dense trained on)
use ``--cont-lr`` with a warm-up of 10% of their steps. Test bits/byte are causal: the MoD
arms' headline is the predictor route, the router route beside it; top-k (non-causal) is
listed, never the headline. A finished run is not trained again; an unfinished one resumes.
Writes RESULTS/conversion.json (with the command), table.md and bpb_vs_flops.png/.svg.

``--analyse`` then asks of the 10% conversions and their from-scratch twins what dynjax asks
of any routed model (each skipped where its output exists): the Frozen-Controller Audit over
the seeds (configs/audit_tiny.py: does the function depend on the routers' coefficients?),
the MoD routing report per seed (precision / recall / F1 of the causal rules against top-k),
and the scorecard of seed 0 (variation, dependence, executed FLOPs and forward latency against
the dense twin). The audit and the scorecard replay the training (top-k) forward: non-causal,
as results/scorecard/ says; the routing report is the causal side.
"""
from __future__ import annotations

from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dynjax.figures import save, styled  # noqa: E402
from dynjax.jsonio import portable, stamp, write_json_atomic, write_text_atomic  # noqa: E402

KINDS = {"dense": "configs/mod_tiny.py:dense", "mod": "configs/mod_tiny.py:mod",
         "moe": "configs/moe_tiny.py:moe"}


def step_flops(kind: str) -> float:
    import jax

    import importlib

    from dynjax.measure import lm_execution
    from dynjax.models import build
    from dynjax.train.lm import init_state, make_optimizer, make_train_step

    module, variant = KINDS[kind].removeprefix("configs/").split(".py:")
    config = importlib.import_module(f"dynjax.configs.{module}").get_config(variant)
    config.model.scan_layers = False           # a scan body would be counted once
    model = build(config.model.to_dict())
    tokens = jax.numpy.zeros((config.train.batch_size, config.data.seq_len), jax.numpy.int32)
    state = init_state(config, model, jax.random.key(0))
    return lm_execution.compiled_flops(make_train_step(model, make_optimizer(config.train)),
                                    state, tokens)


def arms(n: int, flops: dict, seed: int, cont_lr: float) -> dict:
    """name -> (kind, steps, init_from arm or None, training FLOPs in total)."""
    out = {"dense": ("dense", n, None, n * flops["dense"])}
    base = n * flops["dense"]
    for x in (5, 10):
        extra = round(n * x / 100)
        for kind in ("mod", "moe"):
            out[f"{kind}_conv_{x}" if kind == "mod" else f"moe_up_{x}"] = (
                kind, extra, "dense", base + extra * flops[kind])
            on = round(extra * flops[kind] / flops["dense"])
            out[f"dense_on_{kind}_{x}"] = ("dense", on, "dense", base + on * flops["dense"])
    for kind in ("mod", "moe"):
        steps = round((base + round(n / 10) * flops[kind]) / flops[kind])
        out[f"{kind}_scratch"] = (kind, steps, None, steps * flops[kind])
    return out


def train(name: str, arm: tuple, seed: int, runs: Path, cont_lr: float) -> dict:
    kind, steps, source, _ = arm
    workdir = runs / f"{name}_s{seed}"
    if not (workdir / "eval.json").exists():
        cmd = [sys.executable, "train.py", f"--config={KINDS[kind]}", f"--workdir={workdir}",
               f"--config.train.steps={steps}", f"--config.seed={seed}", "--progress=false"]
        if source:
            cmd += [f"--config.train.init_from={runs / f'{source}_s{seed}'}",
                    f"--config.train.lr={cont_lr}",
                    f"--config.train.warmup_steps={max(1, steps // 10)}"]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    return json.loads((workdir / "eval.json").read_text())


def router_ablation(runs: Path, seed: int, windows: int = 64) -> dict:
    """The converted MoD's validation bits/byte before any training, and the fraction of
    tokens its causal rules let in (``asks``; capacity c = 0.125), per router init: the
    fitted rule at several gains, the target's seeded random router (predictor seeded too),
    and a zero router (every score tied: top-k takes the first k tokens of each window)."""
    path = runs / f"router_ablation_s{seed}.json"
    if path.exists():
        return json.loads(path.read_text())
    import importlib

    import jax
    import numpy as np

    from dynjax.runs import rundir
    from dynjax.data import text as text_data
    from dynjax.models import build
    from dynjax.train import convert
    from dynjax.train.evaluation import Evaluator

    src = rundir.load(runs / f"dense_s{seed}")
    module, variant = KINDS["mod"].removeprefix("configs/").split(".py:")
    config = importlib.import_module(f"dynjax.configs.{module}").get_config(variant)
    model = build(config.model.to_dict())
    init = model.init(jax.random.key(seed), np.zeros((1, config.data.seq_len), np.int32))
    splits = text_data.load_splits("embedded")
    calib = text_data.eval_windows(splits["train"], config.data.seq_len,
                                   config.train.init_calibration_windows)
    val = text_data.eval_windows(splits["validation"], config.data.seq_len, windows)
    scorer = Evaluator(model.cfg)
    with_predictor = build(model.cfg.replace(mod_route="predictor"))
    coeffs_of = jax.jit(lambda p, t: with_predictor.apply(p, t)[1])

    def evaluate(params, windows_, batch):
        """bits/byte per route, and the fraction of tokens each causal rule lets in."""
        out = scorer(params, windows_, batch)
        c = coeffs_of(params, windows_[:batch])
        out["asks"] = {r: float((c[r] > 0).mean()) for r in ("router", "predictor")}
        return out

    out = {"windows": windows,
           "dense_source": Evaluator(src.model.cfg)(src.params, val, 64)["bpb"]}
    for gain in (0.5, 1.0, 2.0, 4.0, 8.0):
        params, _ = convert.convert(src.model.cfg, src.params, model.cfg, init, windows=calib,
                                    gain=gain)
        out[f"fitted_gain_{gain:g}"] = evaluate(params, val, 64)
    copied = convert.convert(src.model.cfg, src.params, model.cfg, init, windows=calib)[0]
    seeded = jax.tree_util.tree_map_with_path(
        lambda p, a, i: i if any(getattr(k, "key", None) in ("router", "predictor")
                                 for k in p) else a, copied, init)
    out["seeded_random_router"] = evaluate(seeded, val, 64)
    zero = jax.tree_util.tree_map_with_path(
        lambda p, a: np.zeros_like(a) if any(getattr(k, "key", None) == "router"
                                             for k in p) else a, seeded)
    out["zero_router"] = evaluate(zero, val, 64)
    write_json_atomic(path, out)
    return out


def conversion_record(run: Path) -> dict | None:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    jump = [r for r in lines if r.get("split") == "conversion"]
    if not jump:
        return None
    j = jump[0]
    return {"source_bpb": j["source"]["bpb"], "converted_bpb": j["converted"]["bpb"],
            "converted_routes": {r: v["bpb"] for r, v in j["converted"].get("routes", {}).items()},
            "jump_bpb": j["jump_bpb"], "routers": j.get("routers"),
            "first_logged_train_bpb": next((r["bpb"] for r in lines if "bpb" in r
                                            and "split" not in r), None)}


def routes(test: dict, single: str) -> dict:
    """route -> {bpb, causal}; a model with one rule (dense: forward; top-1 MoE: its
    sequence routing, causal) has no ``routes`` in its eval dict."""
    if "routes" not in test:
        return {single: {"bpb": test["bpb"], "causal": test.get("causal", True)}}
    return {r: {"bpb": v["bpb"], "causal": v["causal"]} for r, v in test["routes"].items()}


def headline(test: dict) -> float:
    return test["bpb"]


@styled
def plot(result: dict):
    """Test bits/byte against total training FLOPs, one line per way of getting there."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    groups = {"dense": ["dense", "dense_on_mod_5", "dense_on_mod_10"],
              "dense (MoE budget)": ["dense", "dense_on_moe_5", "dense_on_moe_10"],
              "MoD converted": ["mod_conv_5", "mod_conv_10"], "MoD from scratch": ["mod_scratch"],
              "MoE upcycled": ["moe_up_5", "moe_up_10"], "MoE from scratch": ["moe_scratch"]}
    for label, names in groups.items():
        names = [n for n in names if n in result["arms"]]
        xs = [result["arms"][n]["total_train_flops"] / 1e12 for n in names]
        ys = [result["arms"][n]["test_bpb_mean"] for n in names]
        if not xs:
            continue
        ax.plot(xs, ys, "o-" if len(xs) > 1 else "s", label=label)
    ax.set_xlabel("total training FLOPs (TFLOP, compiled train steps)")
    ax.set_ylabel("test bits/byte (causal headline route)")
    ax.set_title(f"dense -> MoD / MoE at the tiny size, seeds {result['seeds']}")
    ax.legend()
    return fig


def table(result: dict) -> str:
    rows = ["| arm | steps | total train TFLOP | test bits/byte (headline route) | per seed "
            "| other routes (mean) | minus dense at same budget |", "|---|---|---|---|---|---|---|"]
    for name, a in result["arms"].items():
        others = ", ".join(f"{r} {v:.4f}" + ("" if a["causal"][r] else " (non-causal)")
                           for r, v in a["routes_mean"].items() if r != a["route"])
        ref = a.get("dense_at_same_budget")
        diff = f"{a['test_bpb_mean'] - result['arms'][ref]['test_bpb_mean']:+.4f} vs {ref}" \
            if ref else ""
        per = ", ".join(f"{b:.4f}" for b in a["test_bpb"])
        rows.append(f"| {name} | {a['steps']} | {a['total_train_flops'] / 1e12:.2f} | "
                    f"{a['test_bpb_mean']:.4f} ({a['route']}) | {per} | {others} | {diff} |")
    return "\n".join(rows) + "\n"


ANALYSED = ("mod_conv_10", "mod_scratch", "moe_up_10", "moe_scratch")


def analyse(runs: Path, out: Path, seeds: list) -> dict:
    """Audit, routing report and scorecard of the ``ANALYSED`` arms; their summaries."""
    found = {}
    for name in ANALYSED:
        dirs = [str(runs / f"{name}_s{s}") for s in seeds]
        audit_dir, card_dir = out / f"audit_{name}", out / f"scorecard_{name}"
        if not (audit_dir / "results.json").exists():
            subprocess.run([sys.executable, "audit.py", "--config=configs/audit_tiny.py",
                            f"--out={audit_dir}", f"--checkpoints={','.join(dirs)}"],
                           check=True)
        if not (card_dir / "scorecard.json").exists():
            subprocess.run([sys.executable, "scorecard.py", "--config=configs/scorecard.py",
                            f"--out={card_dir}", dirs[0]], check=True)
        conditions = json.loads((audit_dir / "results.json").read_text())["conditions"]
        card = json.loads((card_dir / "scorecard.json").read_text())["cards"][0]
        found[name] = {
            "audit": str(audit_dir), "scorecard": str(card_dir),
            "forward_audited": "training forward (top-k routing: non-causal)",
            "dnll": {c: [v["estimate"], v["ci_low"], v["ci_high"]] for c, v in conditions.items()
                     if c != "correct"},
            "verdicts": card["verdicts"],
            "execution": {k: v for k, v in card["execution"].items()
                          if isinstance(v, (int, float, str))}}
        if name.startswith("mod"):
            found[name]["routing"] = [routing_report(Path(d)) for d in dirs]
    return found


def routing_report(run: Path, windows: int = 64) -> dict:
    """The MoD routing report of one run (experiments/mod_routing_report.py's numbers)."""
    path = run / "routing_report.json"
    if not path.exists():
        subprocess.run([sys.executable, "experiments/mod_routing_report.py", str(run),
                        f"--windows={windows}", f"--out={path}"], check=True,
                       stdout=subprocess.DEVNULL)
    rep = json.loads(path.read_text())
    return {rule: {k: rep[rule]["causal_forward"][k] for k in ("precision", "recall", "f1")}
            for rule in ("router", "predictor")} | {"base_rate": rep["base_rate"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dense-steps", type=int, default=600)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--only", default="", help="comma-separated arms to train (others: skip)")
    ap.add_argument("--cont-lr", type=float, default=1e-3)
    ap.add_argument("--runs", default="runs/conversion")
    ap.add_argument("--out", default="results/conversion")
    ap.add_argument("--report-only", action="store_true",
                    help="train nothing: tabulate the finished arms, list the unfinished")
    ap.add_argument("--analyse", action="store_true",
                    help="also audit, route-report and score the 10%% conversions and their "
                         "from-scratch twins (written under --out)")
    args = ap.parse_args()
    runs, out = Path(args.runs), Path(args.out)
    runs.mkdir(parents=True, exist_ok=True)
    cache = runs / "step_flops.json"
    if not cache.exists():
        write_json_atomic(cache, {k: step_flops(k) for k in KINDS})
    flops = json.loads(cache.read_text())
    seeds = [int(s) for s in args.seeds.split(",")]
    plan = arms(args.dense_steps, flops, seeds[0], args.cont_lr)
    only = set(filter(None, args.only.split(",")))
    order = ["dense"] + [n for n in plan if n != "dense"]
    evals, unfinished = {}, []
    for name in order:
        if only and name not in only:
            continue
        if args.report_only:      # tabulate what has finished, name the rest
            done = [runs / f"{name}_s{s}" / "eval.json" for s in seeds]
            if not all(p.exists() for p in done):
                unfinished.append(name)
                continue
        evals[name] = [train(name, plan[name], s, runs, args.cont_lr)["test"] for s in seeds]
    if only:
        if "router_ablation" in only:
            print(json.dumps(router_ablation(runs, seeds[0]), indent=1))
        return
    budget_ref = {"mod_conv_5": "dense_on_mod_5", "mod_conv_10": "dense_on_mod_10",
                  "mod_scratch": "dense_on_mod_10", "moe_up_5": "dense_on_moe_5",
                  "moe_up_10": "dense_on_moe_10", "moe_scratch": "dense_on_moe_10"}
    result = {**stamp(), "dense_steps": args.dense_steps, "seeds": seeds,
              "cont_lr": args.cont_lr, "train_step_flops": flops,
              "flops_counted": "XLA cost analysis of the compiled train step, unrolled layers",
              "router_ablation_before_training": router_ablation(runs, seeds[0]),
              "unfinished_arms": unfinished, "arms": {}}
    for name in (n for n in order if n in evals):
        kind, steps, source, total = plan[name]
        tests = evals[name]
        single = "sequence" if kind == "moe" else "forward"
        per_route = [routes(t, single) for t in tests]
        arm = {"kind": kind, "steps": steps, "init_from": source, "total_train_flops": total,
               "route": tests[0].get("route", single),
               "test_bpb": [headline(t) for t in tests],
               "test_bpb_mean": statistics.mean(headline(t) for t in tests),
               "routes_mean": {r: statistics.mean(p[r]["bpb"] for p in per_route)
                               for r in per_route[0]},
               "causal": {r: v["causal"] for r, v in per_route[0].items()}}
        if source and kind != "dense":
            arm["conversion"] = [conversion_record(runs / f"{name}_s{s}") for s in seeds]
        if name in budget_ref and budget_ref[name] in evals:
            arm["dense_at_same_budget"] = budget_ref[name]
        result["arms"][name] = arm
    out.mkdir(parents=True, exist_ok=True)
    if args.analyse:
        result["analysis"] = analyse(runs, out, seeds)
    write_json_atomic(out / "conversion.json", portable(result))
    text = table(result) + (f"\nNot finished when tabulated: {', '.join(unfinished)}.\n"
                            if unfinished else "")
    write_text_atomic(out / "table.md", f"Command: `{result['command']}`\n\n" + text)
    save(plot(result), out / "bpb_vs_flops.png")
    print(text)


if __name__ == "__main__":
    main()
