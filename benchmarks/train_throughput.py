"""Train-step time and tokens/s of every tiny gate variant, measured in one run.

    python benchmarks/train_throughput.py [--steps 20] [--repeats 3] [--out FILE]
    python benchmarks/train_throughput.py --config=featuregate_76m --batch-size=64 \
        --seq-len=512 --variants=dense,uniform,feature_gate,fixed_depth15   # accelerator

Prints JSON: per variant the median step time after warm-up (compilation excluded),
tokens/s, analytic model FLOPs per step and MFU against ``dynjax.measure.mfu.PEAK_FLOPS``
(null on a device the table does not know, e.g. a CPU), and FeatureGate's overhead over dense as a ratio of medians from this same run
(these machines are noisy: compare ratios, not absolute times across runs).
"""
from dynjax.runtime import describe, setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse
import ast
import importlib
import statistics
import time

import jax

from dynjax.measure import mfu  # noqa: E402
from dynjax.train.lm import Training  # noqa: E402
from dynjax.jsonio import command_line, publish_json  # noqa: E402

VARIANTS = ("dense", "uniform", "layer_static", "feature_gate", "fixed_depth2")


def compiled_step(config_module, variant, batch_size, seq_len, model_set=()):
    """train.py's compiled, warmed-up train step (``lm.Training.train_step``: the family's XLA
    options and the mesh's layout included, e.g. MUDD's) of one variant and its state."""
    config = config_module.get_config(variant)
    for item in model_set:  # "field=value", e.g. "remat=False"
        field, _, value = item.partition("=")
        if field not in config.model:
            raise SystemExit(f"--model-set {item!r}: the model config has no field {field!r}")
        config.model[field] = ast.literal_eval(value)
    config.train.batch_size, config.data.seq_len = batch_size, seq_len
    task = Training(config)
    step_fn, state = task.train_step(), task.init_state(jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (batch_size, seq_len), 0, 256)
    state, m = step_fn(state, tokens)  # compile + warm-up
    jax.block_until_ready(m)
    return step_fn, state, tokens, task.model.cfg


def measure(config_module, variants, steps, repeats, batch_size, seq_len, model_set=()):
    """Median step time per variant. Variants take turns in every repeat, so load changes on
    a shared machine hit all of them alike and the ratios stay meaningful."""
    compiled = {v: compiled_step(config_module, v, batch_size, seq_len, model_set) for v in variants}
    times = {v: [] for v in variants}
    for _ in range(repeats):
        for v in variants:
            step_fn, state, tokens, cfg = compiled[v]
            for _ in range(steps):
                t0 = time.perf_counter()
                state, m = step_fn(state, tokens)
                jax.block_until_ready(m)
                times[v].append(time.perf_counter() - t0)
            compiled[v] = (step_fn, state, tokens, cfg)
    out, kind = {}, jax.devices()[0].device_kind
    for v, ts in times.items():
        med, cfg = statistics.median(ts), compiled[v][3]
        out[v] = {"median_step_s": med, "tokens_per_s": batch_size * seq_len / med,
                  "steps_timed": len(ts),
                  "model_flops_per_step": mfu.train_step_flops(cfg, batch_size, seq_len),
                  "mfu": mfu.mfu(cfg, batch_size, seq_len, med, kind)}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="tiny", help="a module in configs/ (tiny, featuregate_76m)")
    ap.add_argument("--model-set", action="append", default=[],
                    help="override a model field, e.g. --model-set remat=False (repeatable)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out")
    args = ap.parse_args()
    config_module = importlib.import_module(f"dynjax.configs.{args.config}")
    res = {"command": command_line(), "runtime": describe(), "backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
           "devices": jax.device_count(), "config": args.config, "model_set": args.model_set,
           "batch_size": args.batch_size, "seq_len": args.seq_len, "variants": {}}
    res["variants"] = measure(config_module, args.variants.split(","), args.steps, args.repeats,
                              args.batch_size, args.seq_len, args.model_set)
    vs = res["variants"]
    if "dense" in vs:
        res["step_time_ratio_vs_dense"] = {
            v: r["median_step_s"] / vs["dense"]["median_step_s"] for v, r in vs.items()}
        if "feature_gate" in vs:
            res["feature_gate_overhead_vs_dense"] = res["step_time_ratio_vs_dense"]["feature_gate"] - 1
    publish_json(res, args.out, indent=1)


if __name__ == "__main__":
    main()
