"""Mixture-of-Depths vs dense of the same size: measured time ratio beside the FLOP ratio.

    python benchmarks/mod_speed.py [--seq-len 1024] [--batch-size 2] [--repeats 7] [--out F]
    python benchmarks/mod_speed.py --d-model=1024 --n-heads=16 --n-layers=8 --dtype=bfloat16 \
        --seq-len=2048 --batch-size=8      # an accelerator-sized model

Models: configs/mod_tiny.py (4 blocks, d=128); ``mod`` has MoD blocks 1 and 3 at capacity
c = 0.125, ``dense`` the same blocks without routing. Measured in one run, medians over
repeats after a warm-up call (compilation excluded), every timed call of both models
interleaved round by round so that load from other processes falls on both alike:

- train step: forward + backward + AdamW update (jit, state donated).
- prefill: one full-sequence forward (top-k routing).
- decode step: one token against a KV cache of seq-len positions (batch ``--decode-batch``).
  A MoD block runs only when the token enters it; the benchmark times a step where the
  token enters every MoD block and one where it enters none (forced through the
  predictor's bias), and reports c * enter + (1 - c) * skip, the expected step time when
  each MoD block takes a fraction c of tokens; ``decode_step_masked_s`` times the variant
  without ``lax.cond`` (every block runs, its result masked).

FLOP ratios: forward from XLA's cost analysis of the unrolled program (all ops) and from
the analytic matmul count; train step from the compiled unrolled step; decode analytic.
Prints JSON (and writes it to ``--out``).
"""
from dynjax.runtime import describe, setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse

import jax
import jax.numpy as jnp

from dynjax.configs import mod_tiny  # noqa: E402
from dynjax import decoding  # noqa: E402
from dynjax.measure import lm_execution as ex  # noqa: E402
from dynjax.measure.latency import decode_timer, paired_medians  # noqa: E402
from dynjax.models import build, mod  # noqa: E402
from dynjax.models.transformer import ModelConfig  # noqa: E402
from dynjax.train.lm import init_state, make_optimizer, make_train_step  # noqa: E402
from dynjax.jsonio import command_line, publish_json  # noqa: E402


def decode_flops(cfg: ModelConfig, max_len: int, enter_fraction: float) -> float:
    """Analytic matmul FLOPs of one decode step (batch 1) against max_len-slot caches."""
    d = cfg.d_model
    per_block = lambda slots: 2 * (4 * d * d + 2 * d * cfg.d_ff) + 2 * 2 * slots * d
    ids = mod.mod_layer_ids(cfg)
    total = (cfg.n_layers - len(ids)) * per_block(max_len) + 2 * d * cfg.vocab_size
    if ids:
        k = mod.capacity(cfg, max_len)
        total += len(ids) * (enter_fraction * per_block(k) + 2 * d)
    return float(total)


def forced_route(cfg: ModelConfig, params, enter: bool):
    """A copy of ``params`` whose predictor sends every token into every MoD block (or past
    it): output weights zero, bias +-30. Only the decision changes, not the step's shapes."""
    forced = jax.tree.map(lambda a: a, params)
    for lp, routed in decoding.mod.layer_params(cfg, forced):
        if routed:
            out = lp["predictor"]["out"]
            out["kernel"] = jnp.zeros_like(out["kernel"])
            out["bias"] = jnp.full_like(out["bias"], 30.0 if enter else -30.0)
    return forced


def measure(variant, args):
    config = mod_tiny.get_config(variant)
    config.train.batch_size, config.data.seq_len = args.batch_size, args.seq_len
    if args.d_model:
        config.model.update(dict(d_model=args.d_model, d_ff=4 * args.d_model))
    for field in ("n_heads", "n_layers", "dtype"):
        if getattr(args, field):
            config.model[field] = getattr(args, field)
    cfg = ModelConfig.from_dict(config.model.to_dict())
    model = build(cfg)
    tokens = jax.random.randint(jax.random.key(1), (args.batch_size, args.seq_len), 0, 256)
    out = {}

    tx = make_optimizer(config.train)
    step_fn = jax.jit(make_train_step(model, tx), donate_argnums=0)
    state = {"s": init_state(config, model, jax.random.key(0))}

    def train_step():
        state["s"], metrics = step_fn(state["s"], tokens)
        return metrics
    timers = {"train_step_s": train_step}
    params = model.init(jax.random.key(0), tokens)  # the train state's are donated
    out["train_step_compiled_flops"] = ex.compiled_flops(
        make_train_step(model, tx), init_state(config, model, jax.random.key(0)), tokens)

    prefill = jax.jit(lambda p, t: model.apply(p, t)[0])
    timers["prefill_s"] = lambda: prefill(params, tokens)
    out["forward_flops"] = ex.flop_report(cfg, args.batch_size, args.seq_len, params)
    out["execution"] = ex.execution_summary(ex.executed_blocks(model, params, tokens),
                                            cfg.n_layers)

    # Decode: one step at the last position of a seq-len cache; the cache is donated and
    # carried from step to step, as in generation (a MoD buffer fills by one per entering
    # step, far below its k slots in this many steps).
    # The slot budget is top-k's k = floor(c * T), so the cache holds what training routes.
    B, T = args.decode_batch, args.seq_len
    slots = mod.capacity(cfg, T) if cfg.variant != "dense" else 0
    dcfg = mod.decode_config(cfg, "predictor").replace(mod_decode_slots=slots)
    out["cache_bytes"] = decoding.cache_bytes(decoding.init_cache(dcfg, B, T))
    time_decode = lambda p, branch="cond": decode_timer(dcfg, p, B, T, branch=branch)

    if cfg.variant == "dense":
        timers["decode_step_s"] = time_decode(params)
        out["decode_flops_analytic"] = decode_flops(cfg, T, 0.0)
        return out, timers
    for name in ("enter", "skip"):
        timers[f"decode_step_{name}_s"] = time_decode(forced_route(cfg, params, name == "enter"))
    # The same step without lax.cond: every MoD block always runs, its result masked. Where
    # a conditional costs a host round trip (a guess for GPUs, to measure), this may win.
    timers["decode_step_masked_s"] = time_decode(params, "masked")
    out["decode_flops_analytic"] = decode_flops(cfg, T, cfg.mod.capacity)
    return out, timers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--decode-batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--d-model", type=int, help="width (d_ff = 4x); default mod_tiny's 128")
    ap.add_argument("--n-heads", type=int)
    ap.add_argument("--n-layers", type=int, help="MoD on every other block")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"))
    ap.add_argument("--out")
    args = ap.parse_args()
    res = {"command": command_line(), "runtime": describe(), "backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
           "devices": jax.device_count(), "model": {k: getattr(args, k) for k in
                                                    ("d_model", "n_heads", "n_layers", "dtype")},
           "seq_len": args.seq_len, "batch_size": args.batch_size,
           "decode_batch": args.decode_batch, "repeats": args.repeats,
           "note": "medians over repeats in this one run; the CPU is shared, compare ratios"}
    (m, m_timers), (d, d_timers) = measure("mod", args), measure("dense", args)
    timers = {**{("mod", k): f for k, f in m_timers.items()},
              **{("dense", k): f for k, f in d_timers.items()}}
    for (model, name), t in paired_medians(timers, args.repeats).items():
        (m if model == "mod" else d)[name] = t
    c = mod_tiny.get_config("mod").model.mod_capacity
    m["decode_step_s"] = c * m["decode_step_enter_s"] + (1 - c) * m["decode_step_skip_s"]
    res["mod"], res["dense"] = m, d
    ratio = lambda a, b: a / b
    res["ratios_mod_over_dense"] = {
        "train_step_time": ratio(m["train_step_s"], d["train_step_s"]),
        "train_step_compiled_flops": ratio(m["train_step_compiled_flops"],
                                           d["train_step_compiled_flops"]),
        "prefill_time": ratio(m["prefill_s"], d["prefill_s"]),
        "forward_compiled_flops": ratio(m["forward_flops"]["compiled_flops"],
                                        d["forward_flops"]["compiled_flops"]),
        "forward_compiled_bytes_accessed": ratio(m["forward_flops"]["compiled_bytes_accessed"],
                                                 d["forward_flops"]["compiled_bytes_accessed"]),
        "forward_analytic_flops": ratio(m["forward_flops"]["analytic_flops"],
                                        d["forward_flops"]["analytic_flops"]),
        "decode_step_time": ratio(m["decode_step_s"], d["decode_step_s"]),
        "decode_step_time_masked": ratio(m["decode_step_masked_s"], d["decode_step_s"]),
        "decode_analytic_flops": ratio(m["decode_flops_analytic"], d["decode_flops_analytic"]),
        "cache_bytes": ratio(m["cache_bytes"], d["cache_bytes"]),
    }
    publish_json(res, args.out, indent=2)


if __name__ == "__main__":
    main()
