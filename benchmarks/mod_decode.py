"""Mixture-of-Depths decode step at batch 1 against dense: time ratio beside the FLOP ratio.

    python benchmarks/mod_decode.py [--repeats 41] [--out results/mod_decode_cpu.json]
    python benchmarks/mod_decode.py --models gpu_T2048 --repeats 21   # on an accelerator

The issue's aim (issue 13): a MoD decode step costs what its FLOPs say, <= 0.6x dense on
CPU, <= 0.7x on GPU. Models (configs/mod_tiny.py: MoD on every other block, c = 0.125,
predictor route, slot budget k = floor(c * T)): ``tiny`` d=128, 4 blocks at T=128 and
T=1024 (benchmarks/mod_speed.py's setting), ``mid`` d=256, 8 blocks (benchmarks/common.py)
at T=1024, float32; ``gpu`` d=1024, 8 blocks, bfloat16 at T=2048 (the model of
results/gpu/mod_speed_gpu.json). Each figure is timed two ways:

- ``call``: one ``decode_step`` dispatched from Python, cache donated and carried
  (``latency.decode_timer``): what a host-driven loop pays, dispatch included;
- ``scan``: 16 steps inside one compiled program, as ``decoding.generate`` runs them
  (``scan_timer``): the step's own cost, no host between steps.

Per model: ``dense``; ``dense_half`` (dense at half the depth: the floor a MoD step would
reach if a skipped block cost nothing); ``enter`` / ``skip`` (every token enters / skips
every MoD block, forced through the predictor's bias, ``mod_speed.forced_route``), whose
mix c * enter + (1 - c) * skip is ``mod_step``, the expected step when each block takes a
fraction c; ``masked`` (no ``lax.cond``: every block runs, its result masked; where a
conditional costs a host round trip, as XLA:GPU's may, this is the one to compare). All
calls of all models interleaved round by round in one run (``latency.paired_times``);
ratios to dense of medians and of minima (steadier on a loaded machine) beside the
analytic FLOP ratio (``mod_speed.decode_flops``). Prints JSON, writes it to ``--out``.
"""
from dynjax.runtime import describe, setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, ".")
from benchmarks.common import bench_config  # noqa: E402
from benchmarks.mod_speed import decode_flops, forced_route  # noqa: E402
from dynjax.configs import mod_tiny  # noqa: E402
from dynjax import decoding  # noqa: E402
from dynjax.measure import latency  # noqa: E402
from dynjax.models import build, mod  # noqa: E402
from dynjax.models.transformer import ModelConfig  # noqa: E402
from dynjax.jsonio import command_line, publish_json  # noqa: E402

MODELS = {"tiny_T128": ("tiny", 128), "tiny_T1024": ("tiny", 1024), "mid_T1024": ("mid", 1024),
          "gpu_T2048": ("gpu", 2048)}  # results/gpu/mod_speed_gpu.json's model, for an accelerator
SIZES = {"mid": {}, "gpu": dict(d_model=1024, n_heads=16, d_ff=4096, dtype="bfloat16")}
DEFAULT = "tiny_T128,tiny_T1024,mid_T1024"
GOAL = {"cpu": 0.6, "gpu": 0.7}
STEPS = 16  # steps per scanned call: every one enters with forced entry (k >= 16 slots)


def scan_timer(cfg: ModelConfig, params, T: int, steps: int = STEPS, branch: str = "cond"):
    """``steps`` greedy decode steps at batch 1 in one compiled program, a scan as
    ``decoding.generate`` runs them, at positions T - steps .. T - 1 of a T-slot cache
    (donated and carried from call to call): per-step time = call time / steps, with no
    dispatch from the host between steps."""
    def run(p, cache):
        def step(carry, t):
            cache, tok = carry
            logits, cache, _ = decoding.decode_step(cfg, p, cache, tok, jnp.full((1,), t),
                                                    branch)
            return (cache, jnp.argmax(logits, -1).astype(tok.dtype)), None
        (cache, _), _ = jax.lax.scan(step, (cache, jnp.zeros((1,), jnp.int32)),
                                     jnp.arange(T - steps, T))
        return cache
    fn = jax.jit(run, donate_argnums=1)
    carry = {"cache": decoding.init_cache(cfg, 1, T)}

    def one():
        carry["cache"] = fn(params, carry["cache"])
        return carry["cache"]
    return one


def model_config(size: str, variant: str) -> ModelConfig:
    config = mod_tiny.get_config(variant) if size == "tiny" else bench_config(variant, 1, 1)
    config.model.update(SIZES.get(size, {}))
    return ModelConfig.from_dict(dict(config.model.to_dict(), remat=False))


def timers(size: str, T: int):
    """name -> zero-argument timer, and the MoD config, for one model at a T-slot cache."""
    tokens = jnp.zeros((1, T), jnp.int32)
    init = lambda cfg: build(cfg).init(jax.random.key(0), tokens)
    dense, mcfg = model_config(size, "dense"), model_config(size, "mod")
    half = dense.replace(n_layers=dense.n_layers // 2)
    dcfg = mod.decode_config(mcfg, "predictor").replace(
                               mod_decode_slots=mod.capacity(mcfg, T))
    params = init(mcfg)
    step = lambda cfg, p, branch="cond": latency.decode_timer(cfg, p, 1, T, branch=branch)
    runs = {"dense": (dense, init(dense)), "dense_half": (half, init(half)),
            "enter": (dcfg, forced_route(mcfg, params, True)),
            "skip": (dcfg, forced_route(mcfg, params, False))}
    out = {("call", k): step(*v) for k, v in runs.items()}
    out["call", "masked"] = step(dcfg, runs["skip"][1], "masked")
    out.update({("scan", k): scan_timer(*v, T) for k, v in runs.items()})
    out["scan", "masked"] = scan_timer(dcfg, runs["skip"][1], T, branch="masked")
    return out, dcfg


def summary(t: dict, cfg: ModelConfig, T: int) -> dict:
    """Times (us per step) and the MoD step's ratios to dense, of medians and of minima, for
    each way of timing ("call": one dispatched step; "scan": steps inside one program)."""
    c = cfg.mod.capacity
    res = {"seq_len": T, "d_model": cfg.d_model, "n_layers": cfg.n_layers,
           "mod_blocks": len(mod.mod_layer_ids(cfg)), "mod_slots": cfg.mod.decode_slots,
           "capacity": c, "scan_steps": STEPS}
    for how in ("call", "scan"):
        per = 1 if how == "call" else STEPS
        for stat in ("median_s", "min_s"):
            s = {k: v[stat] / per for (h, k), v in t.items() if h == how}
            s["mod_step"] = c * s["enter"] + (1 - c) * s["skip"]
            key = f"{how}_{stat[:-2]}"
            res[f"{key}_us"] = {k: round(v * 1e6, 1) for k, v in s.items()}
            res[f"{key}_vs_dense"] = {k: round(v / s["dense"], 3) for k, v in s.items()
                                      if k != "dense"}
    res["analytic_flops_vs_dense"] = round(
        decode_flops(cfg, T, c) / decode_flops(cfg.replace(variant="dense"), T, 0),
        3)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--models", default=DEFAULT, help=f"of {sorted(MODELS)}")
    ap.add_argument("--out")
    args = ap.parse_args()
    names = args.models.split(",")
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        ap.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(sorted(MODELS))}")
    backend = jax.default_backend()
    res = {"command": command_line(), "runtime": describe(), "backend": backend,
           "device_kind": jax.devices()[0].device_kind, "repeats": args.repeats,
           "goal_mod_step_vs_dense": GOAL.get(backend, GOAL["gpu"]),
           "xla_flags": os.environ.get("XLA_FLAGS", ""),
           "load_average_before": latency.load_average(),
           "note": "one run, every call interleaved; compare ratios, not absolute times"}
    t0 = time.time()
    all_timers, cfgs = {}, {}
    for name in names:
        ts, cfgs[name] = timers(*MODELS[name])
        all_timers.update({(name, *k): f for k, f in ts.items()})
    times = latency.paired_times(all_timers, args.repeats)
    res["models"] = {name: summary({(h, k): v for (m, h, k), v in times.items() if m == name},
                                   cfgs[name], MODELS[name][1]) for name in names}
    res["load_average_after"] = latency.load_average()
    res["wall_s"] = round(time.time() - t0, 1)
    publish_json(res, args.out, indent=1)


if __name__ == "__main__":
    main()
