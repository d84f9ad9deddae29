"""The audit paper's execution table: do the residual-gate variants execute less, and run
faster?

    python benchmarks/execution.py --preset tiny     # CPU, CI-sized: results/execution_tiny.json
    python benchmarks/execution.py --preset 76m      # the paper's 76M model, for an accelerator

Variants: dense, uniform, layer_static, feature_gate and fixed_depthK with K = round(15/24
* depth) (the paper's FixedDepth15 of 24; Python's round: 2 of 4 for tiny). Presets:
``tiny`` is configs/tiny.py (4 layers, d=128, float32, T=128); ``76m`` is
configs/featuregate_76m.py (24 layers, d=512, bfloat16, T=512). Parameters are freshly
initialised: every variant runs the same program whatever the values (the gates execute
every block), so timing does not need a trained checkpoint (``dynjax.measure.latency``
times any params).

Per variant, measured in ONE run (every timed call of every variant interleaved, round by
round, medians after a warm-up, ``dynjax.measure.latency``):

- executed blocks per token (``dynjax.measure.lm_execution.executed_blocks``);
- forward FLOPs at batch 8: compiled (XLA cost analysis of the unrolled program) and
  analytic (matmuls), ``execution.flop_report``; compiled FLOPs of one decode step;
- latency per batch at batch 8 (the paper's setting) and 1: ``forward`` (the model's apply
  over b x T: the paper's "latency per batch"), ``prefill`` (the same into a KV cache) and
  ``decode`` (one token per sequence at the last position of a T cache), and throughput
  (tokens/s);
- every figure's ratio to dense (latency: of medians, and of minima in ``latency_min_*``,
  the steadier figure on a loaded machine), beside the paper's (PyTorch, 76M, batch 8): FeatureGate
  1.308x dense latency, FixedDepth15 0.633x.

Prints a Markdown table and writes JSON (with the command and the load average) to
``results/execution_<preset>.json`` (``--out`` to change).
"""
from dynjax.runtime import describe, setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse
import importlib
import json
import time

import jax
import jax.numpy as jnp

from dynjax import decoding  # noqa: E402
from dynjax.measure import lm_execution as ex  # noqa: E402
from dynjax.measure import latency  # noqa: E402
from dynjax.models import build  # noqa: E402
from dynjax.models.transformer import ModelConfig  # noqa: E402
from dynjax.jsonio import command_line, write_json_atomic  # noqa: E402

PRESETS = {"tiny": dict(config="tiny", seq_len=128, repeats=21),
           "76m": dict(config="featuregate_76m", seq_len=512, repeats=9)}
PAPER = {"source": "the audit paper, 76M, batch 8, dense PyTorch",
         "latency_ms": {"dense": 19.36, "uniform": 23.00, "layer_static": 24.10,
                        "feature_gate": 25.31},
         "latency_vs_dense": {"feature_gate": 1.308, "fixed_depth15": 0.633}}


def variants(depth: int):
    k = round(15 / 24 * depth)
    return ["dense", "uniform", "layer_static", "feature_gate", f"fixed_depth{k}"]


def model_config(config_module, variant: str) -> ModelConfig:
    c = config_module.get_config(variant).model.to_dict()
    c["remat"] = False  # inference: nothing to rematerialise
    return ModelConfig.from_dict(c)


def decode_flops(cfg: ModelConfig, params, seq_len: int) -> float:
    """Compiled FLOPs of one decode step at batch 1 (the decoder's layers are unrolled)."""
    cache = jax.eval_shape(lambda: decoding.init_cache(cfg, 1, seq_len))
    tok = jnp.zeros((1,), jnp.int32)
    return ex.compiled_flops(lambda p, c, t: decoding.decode_step(cfg, p, c, t, t)[0],
                             params, cache, tok)


def measure(preset: str, batches, repeats: int, seq_len: int):
    config_module = importlib.import_module(f"dynjax.configs.{PRESETS[preset]['config']}")
    depth = config_module.get_config("dense").model.n_layers
    out, timers = {}, {}
    for v in variants(depth):
        cfg = model_config(config_module, v)
        model = build(cfg)
        tokens = jax.random.randint(jax.random.key(1), (max(batches), seq_len), 0, 256)
        params = model.init(jax.random.key(0), tokens)
        flops = ex.flop_report(cfg, max(batches), seq_len, params)
        out[v] = {
            "config": {k: cfg.to_dict()[k] for k in ("variant", "n_layers", "fixed_depth",
                                                    "d_model", "dtype")},
            "execution": ex.execution_summary(ex.executed_blocks(model, params, tokens),
                                              cfg.n_layers),
            "forward_flops_compiled": flops["compiled_flops"],
            "forward_flops_analytic": flops["analytic_flops"],
            "flops_batch": max(batches),
            "decode_step_flops_compiled_b1": decode_flops(cfg, params, seq_len),
            "cache_bytes_b1": decoding.cache_bytes(decoding.init_cache(cfg, 1, seq_len))}
        for name, fn in latency.model_timers(cfg, params, seq_len, batches).items():
            timers[(v, name)] = fn
    for (v, name), t in latency.paired_times(timers, repeats).items():
        out[v].setdefault("latency_s", {})[name] = t["median_s"]
        out[v].setdefault("latency_min_s", {})[name] = t["min_s"]
    for v in out:
        out[v]["tokens_per_s"] = latency.rates(out[v]["latency_s"], seq_len)
    return out


def ratios(res: dict) -> dict:
    d = res["dense"]
    def one(r):
        x = {"executed_blocks": r["execution"]["mean_executed_blocks"]
             / d["execution"]["mean_executed_blocks"],
             "forward_flops_compiled": r["forward_flops_compiled"] / d["forward_flops_compiled"],
             "forward_flops_analytic": r["forward_flops_analytic"] / d["forward_flops_analytic"],
             "decode_step_flops_compiled": r["decode_step_flops_compiled_b1"]
             / d["decode_step_flops_compiled_b1"]}
        x.update({f"latency_{k}": s / d["latency_s"][k] for k, s in r["latency_s"].items()})
        x.update({f"latency_min_{k}": s / d["latency_min_s"][k]
                  for k, s in r["latency_min_s"].items()})
        return x
    return {v: one(r) for v, r in res.items()}


def markdown(res: dict, rat: dict, batches) -> str:
    cols = ["variant", "blocks/token", "FLOPs compiled", "FLOPs analytic"]
    for b in batches:
        cols += [f"forward b{b}", f"prefill b{b}", f"decode b{b}"]
    cols += [f"tokens/s forward b{batches[0]}", f"tokens/s decode b{batches[0]}"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for v, r in res.items():
        q = rat[v]
        row = [v, f"{r['execution']['mean_executed_blocks']:.0f}",
               f"{q['forward_flops_compiled']:.3f}x", f"{q['forward_flops_analytic']:.3f}x"]
        for b in batches:
            for kind in latency.KINDS:
                k = f"{kind}_b{b}"
                row.append(f"{r['latency_s'][k] * 1e3:.2f} ms ({q['latency_' + k]:.2f}x, "
                           f"min {q['latency_min_' + k]:.2f}x)")
        row += [f"{r['tokens_per_s'][f'forward_b{batches[0]}']:,.0f}",
                f"{r['tokens_per_s'][f'decode_b{batches[0]}']:,.0f}"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--batches", default="8,1")
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--out")
    args = ap.parse_args()
    preset = PRESETS[args.preset]
    batches = [int(b) for b in args.batches.split(",")]
    repeats = args.repeats or preset["repeats"]
    seq_len = args.seq_len or preset["seq_len"]
    res = {"command": command_line(), "runtime": describe(), "preset": args.preset,
           "backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
           "seq_len": seq_len, "batches": batches, "repeats": repeats,
           "load_average_before": latency.load_average(),
           "note": "medians of interleaved calls in this one run; compare ratios to dense",
           "paper": PAPER}
    t0 = time.time()
    res["variants"] = measure(args.preset, batches, repeats, seq_len)
    res["load_average_after"] = latency.load_average()
    res["wall_s"] = round(time.time() - t0, 1)
    res["ratios_vs_dense"] = ratios(res["variants"])
    res["table_md"] = markdown(res["variants"], res["ratios_vs_dense"], batches)
    print(json.dumps({k: v for k, v in res.items() if k != "table_md"}, indent=1))
    print(res["table_md"])
    write_json_atomic(args.out or f"results/execution_{args.preset}.json", res)


if __name__ == "__main__":
    main()
