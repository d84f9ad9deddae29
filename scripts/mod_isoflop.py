"""Mixture-of-Depths against its dense twin at equal training FLOPs: one command.

    .venv/bin/python scripts/mod_isoflop.py [--dense-steps 600] [--seeds 0,1]

The MoD paper's claim is about quality per FLOP, so a MoD model trained for the same number
of steps as dense (what ``configs/mod_tiny.py`` does) answers the wrong question. This
script measures the compiled FLOPs of one training step of each (unrolled program, XLA cost
analysis; :mod:`dynjax.measure.execution`), trains dense for ``--dense-steps`` and MoD for
``dense_steps / flop_ratio`` steps (each with its own warm-up/cosine schedule over its own
length), and compares test bits/byte per seed. A finished run is not trained again.
Writes ``results/mod_isoflop.json`` and prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import jax

sys.path.insert(0, ".")
from configs import mod_tiny  # noqa: E402
from dynjax.measure import execution  # noqa: E402
from dynjax.models import build  # noqa: E402
from dynjax.train.loop import init_state, make_optimizer, make_train_step  # noqa: E402
from dynjax.train.metrics import write_json_atomic  # noqa: E402


def train_step_flops(variant: str) -> float:
    config = mod_tiny.get_config(variant)
    config.model.scan_layers = False  # count every layer (a scan body is counted once)
    model = build(config.model.to_dict())
    tokens = jax.numpy.zeros((config.train.batch_size, config.data.seq_len), jax.numpy.int32)
    state = init_state(config, model, jax.random.key(0))
    return execution.compiled_flops(make_train_step(model, make_optimizer(config.train)),
                                    state, tokens)


def train(variant: str, steps: int, seed: int, runs: Path) -> dict:
    workdir = runs / f"{variant}_s{seed}"
    if not (workdir / "eval.json").exists():
        cmd = [sys.executable, "train.py", f"--config=configs/mod_tiny.py:{variant}",
               f"--workdir={workdir}", f"--config.train.steps={steps}", f"--config.seed={seed}",
               "--progress=false"]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    with open(workdir / "eval.json") as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dense-steps", type=int, default=600)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--runs", default="runs/mod_isoflop")
    ap.add_argument("--out", default="results/mod_isoflop.json")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    flops = {v: train_step_flops(v) for v in ("dense", "mod")}
    ratio = flops["mod"] / flops["dense"]
    steps = {"dense": args.dense_steps, "mod": round(args.dense_steps / ratio)}
    runs = Path(args.runs)
    bpb = {v: [train(v, steps[v], s, runs)["test"]["bpb"] for s in seeds] for v in steps}
    result = {"train_step_flops": flops, "flop_ratio_mod_over_dense": ratio, "steps": steps,
              "total_train_flops": {v: flops[v] * steps[v] for v in steps}, "seeds": seeds,
              "test_bpb": bpb, "mean_test_bpb": {v: statistics.mean(b) for v, b in bpb.items()},
              "mod_minus_dense_per_seed": [m - d for m, d in zip(bpb["mod"], bpb["dense"])]}
    write_json_atomic(Path(args.out), result)
    print(f"MoD/dense train-step FLOPs {ratio:.3f}: dense {steps['dense']} steps, "
          f"MoD {steps['mod']} steps\n")
    print("| model | steps | train FLOPs | test bits/byte per seed | mean |")
    print("|---|---|---|---|---|")
    for v in steps:
        per = ", ".join(f"{b:.4f}" for b in bpb[v])
        print(f"| {v} | {steps[v]} | {flops[v] * steps[v]:.3g} | {per} | "
              f"{statistics.mean(bpb[v]):.4f} |")


if __name__ == "__main__":
    main()
