"""Mixture-of-Depths decode step at batch 1 against dense: time ratio beside the FLOP ratio.

    python benchmarks/mod_decode.py [--repeats 41] [--out results/mod_decode_cpu.json]

The issue's aim (issue 13): a MoD decode step costs what its FLOPs say, <= 0.6x dense on
CPU, <= 0.7x on GPU. Models (configs/mod_tiny.py: MoD on every other block, c = 0.125,
predictor route, slot budget k = floor(c * T), float32): ``tiny`` d=128, 4 blocks at
T=128 and T=1024 (benchmarks/mod_speed.py's setting), ``mid`` d=256, 8 blocks
(benchmarks/common.py) at T=1024. One step at the last position of a T cache, donated and
carried (``latency.decode_timer``). Timed in one run, every call of every model
interleaved round by round (``latency.paired_times``):

- ``dense``: the dense twin; ``dense_half``: dense at half the depth, the floor a MoD step
  would reach if a skipped block cost nothing and no token ever entered;
- ``enter`` / ``skip``: MoD with every token entering / skipping every MoD block (forced
  through the predictor's bias, ``mod_speed.forced_route``); the MoD step is
  c * enter + (1 - c) * skip, the expected time when each block takes a fraction c;
- ``masked``: MoD without ``lax.cond`` (every block runs, its result masked).

Ratios to dense of medians and of minima (the steadier figure on a loaded machine), and
the analytic FLOP ratio (``mod_speed.decode_flops``). Prints JSON, writes it to ``--out``.
"""
import argparse
import dataclasses
import json
import sys
import time

import jax

sys.path.insert(0, ".")
from benchmarks.common import bench_config  # noqa: E402
from benchmarks.mod_speed import decode_flops, forced_route  # noqa: E402
from configs import mod_tiny  # noqa: E402
from dynjax.measure import latency  # noqa: E402
from dynjax.models import build, mod  # noqa: E402
from dynjax.models.transformer import ModelConfig  # noqa: E402
from dynjax.train.metrics import write_json_atomic  # noqa: E402

MODELS = {"tiny_T128": ("tiny", 128), "tiny_T1024": ("tiny", 1024), "mid_T1024": ("mid", 1024)}
GOAL = {"cpu": 0.6, "gpu": 0.7}


def model_config(size: str, variant: str) -> ModelConfig:
    config = mod_tiny.get_config(variant) if size == "tiny" else bench_config(variant, 1, 1)
    return ModelConfig.from_dict(dict(config.model.to_dict(), remat=False))


def timers(size: str, T: int):
    """name -> zero-argument timer, and the MoD config, for one model at a T-slot cache."""
    tokens = jax.numpy.zeros((1, T), jax.numpy.int32)
    init = lambda cfg: build(cfg).init(jax.random.key(0), tokens)
    dense, mcfg = model_config(size, "dense"), model_config(size, "mod")
    half = dataclasses.replace(dense, n_layers=dense.n_layers // 2)
    dcfg = dataclasses.replace(mod.decode_config(mcfg, "predictor"),
                               mod_decode_slots=mod.capacity(mcfg, T))
    params = init(mcfg)
    step = lambda cfg, p, branch="cond": latency.decode_timer(cfg, p, 1, T, branch=branch)
    out = {"dense": step(dense, init(dense)), "dense_half": step(half, init(half)),
           "enter": step(dcfg, forced_route(mcfg, params, True)),
           "skip": step(dcfg, forced_route(mcfg, params, False)),
           "masked": step(dcfg, forced_route(mcfg, params, False), "masked")}
    return out, dcfg


def summary(t: dict, cfg: ModelConfig, T: int) -> dict:
    """Times (us) and the MoD step's ratios to dense, of medians and of minima."""
    c = cfg.mod_capacity
    res = {"seq_len": T, "d_model": cfg.d_model, "n_layers": cfg.n_layers,
           "mod_blocks": len(mod.mod_layer_ids(cfg)), "mod_slots": cfg.mod_decode_slots,
           "capacity": c}
    for stat in ("median_s", "min_s"):
        s = {k: v[stat] for k, v in t.items()}
        s["mod_step"] = c * s["enter"] + (1 - c) * s["skip"]
        key = stat[:-2]
        res[f"{key}_us"] = {k: round(v * 1e6, 1) for k, v in s.items()}
        res[f"{key}_vs_dense"] = {k: round(v / s["dense"], 3) for k, v in s.items()
                                  if k != "dense"}
    res["analytic_flops_vs_dense"] = round(
        decode_flops(cfg, T, c) / decode_flops(dataclasses.replace(cfg, variant="dense"), T, 0),
        3)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out")
    args = ap.parse_args()
    names = args.models.split(",")
    backend = jax.default_backend()
    res = {"command": "python " + " ".join(sys.argv), "backend": backend,
           "device_kind": jax.devices()[0].device_kind, "repeats": args.repeats,
           "goal_mod_step_vs_dense": GOAL.get(backend, GOAL["gpu"]),
           "load_average_before": latency.load_average(),
           "note": "one run, every call interleaved; compare ratios, not absolute times"}
    t0 = time.time()
    all_timers, cfgs = {}, {}
    for name in names:
        ts, cfgs[name] = timers(*MODELS[name])
        all_timers.update({(name, k): f for k, f in ts.items()})
    times = latency.paired_times(all_timers, args.repeats)
    res["models"] = {name: summary({k: v for (m, k), v in times.items() if m == name},
                                   cfgs[name], MODELS[name][1]) for name in names}
    res["load_average_after"] = latency.load_average()
    res["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(res, indent=1))
    if args.out:
        write_json_atomic(args.out, res)


if __name__ == "__main__":
    main()
