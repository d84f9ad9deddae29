"""Dropless (sort by expert) vs one-hot (GShard) MoE dispatch: time and compiled temporaries.

    python benchmarks/moe_dispatch.py --out results/moe_dispatch.json
    python benchmarks/moe_dispatch.py --experts 8 64 128 --tokens 4096 16384 65536 \
        --d-model 1024 --d-ff 2048      # an accelerator-sized grid (scripts/gpu_checks.sh)

One MoE FFN layer (``dynjax.models.moe.MoeFfn``: router, E GELU experts d -> d_ff -> d,
token-choice top-k), float32, on ``tokens`` tokens as sequences of ``--seq-len`` (the
one-hot form's group is one sequence). Three dispatches of the same parameters:

- ``dropless``: ``moe_dispatch="dropless"`` (``dynjax.models.dispatch``);
- ``onehot_cf1.25``: one-hot buffers of ceil(1.25 * k * T / E) slots (drops when full);
- ``onehot_cf0``: one-hot buffers of T slots, which never drop: the function dropless
  computes (skipped where its [tokens, E, T] tensors exceed ``--max-onehot-elems``).

Beside them, ``dense_gemm``: the same expert FLOPs as one dense GELU MLP over the N k
(token, choice) rows (an (N k, d) x (d, d_ff) matmul, GELU, (N k, d_ff) x (d_ff, d)), the
machine's own matmul rate on that work; ``gemm_fraction`` is dropless's achieved rate on
the experts' FLOPs over it (dense seconds / dropless seconds; dropless also pays its
router, sort, gather and combine). Goal: >= 0.7 at >= 16k tokens. ``--dispatches`` picks
which to run (e.g. ``dropless dense_gemm`` for the fraction alone).

Programs: ``forward`` (the layer's output) and ``train`` (forward + backward: gradients of
a scalar loss with respect to every parameter and the input). Timings: medians over
``--repeats`` interleaved rounds after a warm-up (``dynjax.measure.latency.paired_times``:
load from other processes falls on every dispatch alike). Temporaries: XLA's
``memory_analysis().temp_size_in_bytes`` of each compiled program; ``--memory-tokens``
adds compile-only points (no run) for the growth in tokens. Prints JSON (and writes
``--out``) with the command and the runtime settings.
"""
from dynjax.runtime import describe, setup  # noqa: E402  one runtime set-up for every program
setup(__name__)
import argparse  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from dynjax.jsonio import command_line, publish_json  # noqa: E402
from dynjax.measure.latency import paired_times  # noqa: E402
from dynjax.models import dispatch, moe  # noqa: E402
from dynjax.models.transformer import ModelConfig  # noqa: E402

DISPATCHES = {"dropless": ("dropless", 0.0), "onehot_cf1.25": ("onehot", 1.25),
              "onehot_cf0": ("onehot", 0.0)}


def layer_config(args, E, k, name):
    mode, cf = DISPATCHES[name]
    return ModelConfig(family="moe", variant="moe", d_model=args.d_model, n_heads=1,
                       n_layers=1, d_ff=args.d_ff).replace(
        moe_num_experts=E, moe_num_experts_per_tok=k, moe_capacity_factor=cf,
        moe_dispatch=mode)


def programs(cfg, x, params):
    """Compiled (forward, train) of one layer; train returns the gradients."""
    ffn = moe.MoeFfn(cfg)
    fwd = jax.jit(lambda p, x: ffn.apply(p, x)[0])
    loss = lambda p, x: jnp.mean(ffn.apply(p, x)[0] ** 2)
    train = jax.jit(jax.grad(loss, argnums=(0, 1)))
    return fwd.lower(params, x).compile(), train.lower(params, x).compile()


def temp_bytes(compiled) -> int:
    return int(compiled.memory_analysis().temp_size_in_bytes)


def onehot_elems(cfg, n_tokens, seq_len) -> int:
    """Elements of the one-hot form's largest tensor, [B, T, k, E, C] (slots per choice)."""
    C = moe.expert_capacity(cfg, seq_len)
    return n_tokens * cfg.moe.num_experts_per_tok * moe.n_routes(cfg) * C


def dense_programs(args, k, n_tokens):
    """(forward, train, params, rows) of one dense GELU MLP over the N k routed rows: the
    experts' FLOPs as plain matmuls."""
    keys = jax.random.split(jax.random.key(2), 3)
    rows = jax.random.normal(keys[0], (n_tokens * k, args.d_model))
    params = {"wi": 0.02 * jax.random.normal(keys[1], (args.d_model, args.d_ff)),
              "wo": 0.02 * jax.random.normal(keys[2], (args.d_ff, args.d_model))}
    mlp = lambda p, x: nn.gelu(x @ p["wi"]) @ p["wo"]
    loss = lambda p, x: jnp.mean(mlp(p, x) ** 2)
    fwd = jax.jit(mlp).lower(params, rows).compile()
    train = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, rows).compile()
    return fwd, train, params, rows


def inputs(args, n_tokens):
    return jax.random.normal(jax.random.key(0), (n_tokens // args.seq_len, args.seq_len,
                                                 args.d_model))


def case(args, E, k, n_tokens):
    x = inputs(args, n_tokens)
    params = nn.meta.unbox(moe.MoeFfn(layer_config(args, E, k, "dropless")).init(
        jax.random.key(1), x))
    timers, out = {}, {"experts": E, "top_k": k, "tokens": n_tokens, "dispatch": {}}
    if "dense_gemm" in args.dispatches:
        fwd, train, dense_params, rows = dense_programs(args, k, n_tokens)
        out["dispatch"]["dense_gemm"] = {"forward_temp_bytes": temp_bytes(fwd),
                                         "train_temp_bytes": temp_bytes(train)}
        timers["dense_gemm/forward"] = lambda f=fwd: f(dense_params, rows)
        timers["dense_gemm/train"] = lambda f=train: f(dense_params, rows)
    for name in [d for d in DISPATCHES if d in args.dispatches]:
        cfg = layer_config(args, E, k, name)
        if name != "dropless" and onehot_elems(cfg, n_tokens, args.seq_len) > args.max_onehot_elems:
            out["dispatch"][name] = {"skipped": "one-hot tensors over --max-onehot-elems"}
            continue
        fwd, train = programs(cfg, x, params)
        out["dispatch"][name] = {"forward_temp_bytes": temp_bytes(fwd),
                                 "train_temp_bytes": temp_bytes(train)}
        timers[f"{name}/forward"] = lambda f=fwd: f(params, x)
        timers[f"{name}/train"] = lambda f=train: f(params, x)
    for label, t in paired_times(timers, args.repeats, args.settle).items():
        name, prog = label.split("/")
        out["dispatch"][name][f"{prog}_median_s"] = t["median_s"]
        out["dispatch"][name][f"{prog}_min_s"] = t["min_s"]
    drop = out["dispatch"]["dropless"]
    out["speedup"] = {f"{name}/{prog}": other[f"{prog}_median_s"] / drop[f"{prog}_median_s"]
                      for name, other in out["dispatch"].items() if name != "dropless"
                      and "skipped" not in other for prog in ("forward", "train")}
    if "dense_gemm" in out["dispatch"]:
        out["gemm_fraction"] = {prog: out["speedup"].pop(f"dense_gemm/{prog}")
                                for prog in ("forward", "train")}
    parts = [f"{n} {v:.2f}x" for n, v in out["speedup"].items()] + [
        f"dense GEMM rate fraction {p} {v:.2f}" for p, v in out.get("gemm_fraction", {}).items()]
    print(f"E={E} k={k} tokens={n_tokens}: " + ", ".join(parts), flush=True)
    return out


def memory_growth(args, E, k):
    """Compiled train-step temporaries at each of ``--memory-tokens`` (compile only)."""
    rows = []
    for n_tokens in args.memory_tokens:
        x = jax.ShapeDtypeStruct((n_tokens // args.seq_len, args.seq_len, args.d_model),
                                 jnp.float32)
        row = {"tokens": n_tokens}
        for name in ("dropless", "onehot_cf1.25"):
            cfg = layer_config(args, E, k, name)
            params = jax.eval_shape(lambda: nn.meta.unbox(moe.MoeFfn(cfg).init(
                jax.random.key(1), jnp.zeros(x.shape))))
            row[name] = temp_bytes(programs(cfg, x, params)[1])
        rows.append(row)
    return {"experts": E, "top_k": k, "train_temp_bytes": rows}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experts", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--top-k", type=int, nargs="+", default=[1, 2, 8])
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--memory-tokens", type=int, nargs="*", default=[4096, 16384, 65536])
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--d-ff", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--settle", type=int, default=0,
                    help="untimed calls before each timed one (calls in a row, as training makes)")
    ap.add_argument("--dispatches", nargs="+", default=[*DISPATCHES, "dense_gemm"],
                    choices=[*DISPATCHES, "dense_gemm"], help="dropless is always run")
    ap.add_argument("--max-onehot-elems", type=float, default=2.5e8)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    args.dispatches = ["dropless", *[d for d in args.dispatches if d != "dropless"]]
    cases = [case(args, E, k, n) for E in args.experts for k in args.top_k
             for n in args.tokens if k <= E]
    growth = [memory_growth(args, E, 2) for E in args.experts] if args.memory_tokens else []
    result = {"command": command_line(), "runtime": describe(),
              "backend": jax.default_backend(), "grouped_matmul": dispatch.default_impl(),
              "layer": {"d_model": args.d_model, "d_ff": args.d_ff, "seq_len": args.seq_len,
                        "dtype": "float32", "repeats": args.repeats, "settle": args.settle},
              "dispatches": args.dispatches, "cases": cases, "memory_growth": growth,
              "goal": "gemm_fraction (dense_gemm seconds / dropless seconds, same FLOPs) "
                      ">= 0.7 at >= 16k tokens"}
    publish_json(result, args.out)


if __name__ == "__main__":
    main()
