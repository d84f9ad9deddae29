"""Mixture-of-Depths against its dense twin at equal training FLOPs, scored causally.

    .venv/bin/python experiments/mod_isoflop.py [--dense-steps 600] [--seeds 0,1,2]

The MoD paper's claim is about quality per FLOP, so a MoD model trained for the same number
of steps as dense answers the wrong question. This script measures the compiled FLOPs of one
training step of each arm (unrolled program, XLA cost analysis, every op: routers and the
predictor included), trains dense for ``--dense-steps`` and each MoD arm for
``dense_steps * dense_flops / arm_flops`` steps (each with its own warm-up/cosine schedule),
and compares test bits/byte per seed under every routing rule: top-k (non-causal: later
tokens decide who enters, so it is never the headline), router threshold and predictor
(causal). It also writes each MoD run's routing report (precision / recall / F1 of the
decode rules against top-k membership) and the KV-cache decoder's agreement with the
causal forward. Arms:

- ``mod``: configs/mod_tiny.py as it is (aux BCE weights 0.01, predictor hidden 32);
- ``mod_aux``: what the MoD paper suggests when decoding is the bottleneck: a stronger
  predictor (hidden 128) and ten times the auxiliary loss weights (0.1).

A finished run is not trained again. Writes ``results/mod_isoflop.json`` (with the command)
and prints a Markdown table.
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

import jax

from dynjax.configs import mod_tiny  # noqa: E402
from dynjax.data import text  # noqa: E402
from dynjax.measure import lm_execution, routing  # noqa: E402
from dynjax.models import build  # noqa: E402
from dynjax.runs import rundir  # noqa: E402
from dynjax.train.lm import init_state, make_optimizer, make_train_step  # noqa: E402
from dynjax.jsonio import portable, stamp, write_json_atomic  # noqa: E402

ARMS = {"dense": ("dense", {}),
        "mod": ("mod", {}),
        "mod_aux": ("mod", {"mod_predictor_hidden": 128, "mod_bce_weight": 0.1,
                            "mod_predictor_weight": 0.1})}


def arm_config(arm: str):
    variant, overrides = ARMS[arm]
    config = mod_tiny.get_config(variant)
    config.model.update(overrides)
    return config


def train_step_flops(arm: str) -> float:
    config = arm_config(arm)
    config.model.scan_layers = False  # count every layer (a scan body is counted once)
    model = build(config.model.to_dict())
    tokens = jax.numpy.zeros((config.train.batch_size, config.data.seq_len), jax.numpy.int32)
    state = init_state(config, model, jax.random.key(0))
    return lm_execution.compiled_flops(make_train_step(model, make_optimizer(config.train)),
                                    state, tokens)


def train(arm: str, steps: int, seed: int, runs: Path) -> dict:
    workdir = runs / f"{arm}_s{seed}"
    if not (workdir / "eval.json").exists():
        variant, overrides = ARMS[arm]
        cmd = [sys.executable, "train.py", f"--config=configs/mod_tiny.py:{variant}",
               f"--workdir={workdir}", f"--config.train.steps={steps}", f"--config.seed={seed}",
               "--progress=false"] + [f"--config.model.{k}={v}" for k, v in overrides.items()]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    return json.loads((workdir / "eval.json").read_text())


def routing_of(run_dir: Path, windows: int) -> dict:
    path = run_dir / "routing_report.json"
    if not path.exists():
        config, model, params = rundir.load_params(run_dir)
        dc = config.data
        splits = text.load_splits(dc.source, dc.get("path"), dc.get("tfds_name"),
                                  dc.get("data_dir"))
        test = text.eval_windows(splits["test"], dc.seq_len, windows)
        write_json_atomic(path, routing.routing_report(model, params, test))
    return json.loads(path.read_text())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dense-steps", type=int, default=600)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--arms", default="dense,mod,mod_aux")
    ap.add_argument("--runs", default="runs/mod_isoflop_causal")
    ap.add_argument("--routing-windows", type=int, default=128)
    ap.add_argument("--out", default="results/mod_isoflop.json")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    arms = args.arms.split(",")
    flops = {a: train_step_flops(a) for a in arms}
    steps = {a: round(args.dense_steps * flops["dense"] / flops[a]) for a in arms}
    runs = Path(args.runs)
    evals = {a: [train(a, steps[a], s, runs)["test"] for s in seeds] for a in arms}

    def per_route(a):
        if "routes" not in evals[a][0]:
            return {"forward": {"causal": True, "bpb": [e["bpb"] for e in evals[a]]}}
        return {r: {"causal": v["causal"], "bpb": [e["routes"][r]["bpb"] for e in evals[a]]}
                for r, v in evals[a][0]["routes"].items()}

    table = {a: per_route(a) for a in arms}
    for a in arms:
        for r in table[a].values():
            r["mean"] = statistics.mean(r["bpb"])
            if a != "dense":
                r["minus_dense_per_seed"] = [m - d for m, d in
                                             zip(r["bpb"], table["dense"]["forward"]["bpb"])]
    result = {
        **stamp(),
        "train_step_flops": flops, "flops_counted": "compiled train step, unrolled layers",
        "steps": steps, "total_train_flops": {a: flops[a] * steps[a] for a in arms},
        "seeds": seeds, "test_bpb": table,
        "headline_route": {a: evals[a][0].get("route", "forward") for a in arms},
        "decode_agreement": {a: [e.get("decode_agreement", {}) for e in evals[a]]
                             for a in arms if a != "dense"},
        "routing": {a: [routing_of(runs / f"{a}_s{s}", args.routing_windows) for s in seeds]
                    for a in arms if a != "dense"}}
    write_json_atomic(Path(args.out), portable(result))
    print("train-step FLOPs relative to dense: "
          + ", ".join(f"{a} {flops[a] / flops['dense']:.3f} ({steps[a]} steps)" for a in arms))
    print("\n| arm | routing | causal | test bits/byte per seed | mean | minus dense |")
    print("|---|---|---|---|---|---|")
    for a in arms:
        for r, v in table[a].items():
            per = ", ".join(f"{b:.4f}" for b in v["bpb"])
            diff = (f"{statistics.mean(v['minus_dense_per_seed']):+.4f}"
                    if "minus_dense_per_seed" in v else "")
            print(f"| {a} | {r} | {'yes' if v['causal'] else 'NO'} | {per} | "
                  f"{v['mean']:.4f} | {diff} |")


if __name__ == "__main__":
    main()
