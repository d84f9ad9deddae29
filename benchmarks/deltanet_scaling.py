"""Gated DeltaNet's forward grows linearly in sequence length; softmax attention's does not.

    python benchmarks/deltanet_scaling.py --out results/deltanet_scaling.json
    python benchmarks/deltanet_scaling.py --tokens 1024 4096 16384 65536 --d-model 2048 \
        --key-heads 16 --value-heads 32 --head-dim 128   # Qwen3-Next's widths, on an accelerator

One Gated DeltaNet token mixer (``components.deltanet.mix``: projections, causal conv,
the chunked delta rule, gated norm, output projection; float32, batch 1) at each length in
``--tokens``, beside the causal softmax attention the core transformer uses
(``dynjax.models.transformer.causal_attention``, ``--value-heads`` heads of ``--head-dim``,
projections included) on the same input. Timings: median and minimum over ``--repeats``
interleaved rounds after a warm-up (``dynjax.measure.latency.paired_times``), each length on
its own compiled program; ``per_token_us`` = time / tokens, flat when the cost is linear.
``temp_bytes``: XLA's compiled temporaries; ``compile_s`` each program's compile time;
``max_rss_bytes`` the process's peak memory. The attention baseline is the cost that grows:
at 16k tokens its program holds 4.5 GB of temporaries (every query block's logits at once,
T^2) and compiles in ~50 s on a loaded 2-core CPU, where DeltaNet's holds 152 MB; on a
machine shared by many jobs the run then sits at the few percent of a core it gets (the
16k point that "stalled" before was starved, not stuck): progress lines say which program
it is on, and ``--attention-max-tokens 4096`` times the baseline only up to that length
(DeltaNet at every length). Prints JSON (and writes ``--out``) with the
command and the runtime settings; timings on a shared machine say so in ``--note``.
"""
from dynjax.runtime import describe, setup  # noqa: E402  one runtime set-up for every program
setup(__name__)
import argparse  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
import zlib  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from dynjax.jsonio import command_line, publish_json  # noqa: E402
from dynjax.measure.latency import paired_times  # noqa: E402
from dynjax.models.components import deltanet  # noqa: E402
from dynjax.models.transformer import causal_attention  # noqa: E402


def params_for(rows, key):
    """N(0, 1/fan_in) weights for every row of a parameter table; A_log, dt_bias as fla."""
    out = {}
    for path, shape, _ in rows:
        name = path[-1]
        k = jax.random.fold_in(key, zlib.crc32(name.encode()))
        if name == "A_log":
            out[name] = jnp.log(jax.random.uniform(k, shape, minval=1.0, maxval=16.0))
        elif name in ("dt_bias", "norm"):
            out[name] = jnp.ones(shape)
        else:
            out[name] = jax.random.normal(k, shape) / jnp.sqrt(shape[0])
    return out


def attention_layer(heads, head_dim):
    def run(p, x):
        q, k, v = (jnp.einsum("btd,dhk->bthk", x, p[n]) for n in ("q", "k", "v"))
        pos = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
        out, _, _ = causal_attention(q, k, v, pos, pos, 512)
        return jnp.einsum("bthk,hkd->btd", out, p["o"])
    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--key-heads", type=int, default=2)
    ap.add_argument("--value-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--attention-max-tokens", type=int, default=0,
                    help="time the attention baseline only up to this length (0: always); "
                         "its quadratic program is what a starved shared CPU cannot finish")
    ap.add_argument("--note", default="")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    dims = deltanet.Dims(hidden_size=args.d_model, key_heads=args.key_heads,
                         value_heads=args.value_heads, key_dim=args.head_dim,
                         value_dim=args.head_dim, chunk_size=args.chunk)
    key = jax.random.key(0)
    p_dn = params_for(deltanet.param_rows(dims, ()), key)
    D, H, hd = args.d_model, args.value_heads, args.head_dim
    p_at = {n: jax.random.normal(jax.random.fold_in(key, i), (D, H, hd)) / jnp.sqrt(D)
            for i, n in enumerate("qkv")}
    p_at["o"] = jax.random.normal(jax.random.fold_in(key, 9), (H, hd, D)) / jnp.sqrt(H * hd)
    dn = jax.jit(lambda p, x: deltanet.mix(dims, p, x)[0])
    at = jax.jit(attention_layer(H, hd))
    rows = []
    for T in args.tokens:
        x = jax.random.normal(jax.random.key(T), (1, T, D))
        compiled, compile_s = {}, {}
        programs = [("deltanet", dn, p_dn), ("attention", at, p_at)]
        if args.attention_max_tokens and T > args.attention_max_tokens:
            programs = programs[:1]
        for name, fn, p in programs:
            print(f"T={T}: compiling {name}", flush=True)   # progress, not a stall
            t0 = time.perf_counter()
            compiled[name] = fn.lower(p, x).compile()
            compile_s[name] = time.perf_counter() - t0
        params = {"deltanet": p_dn, "attention": p_at}
        print(f"T={T}: timing ({args.repeats} rounds)", flush=True)
        times = paired_times({n: (lambda c=c, p=params[n]: c(p, x))
                              for n, c in compiled.items()}, args.repeats)
        row = {"tokens": T}
        for n, c in compiled.items():
            row[n] = {"median_s": times[n]["median_s"], "min_s": times[n]["min_s"],
                      "per_token_us": 1e6 * times[n]["min_s"] / T,
                      "temp_bytes": int(c.memory_analysis().temp_size_in_bytes),
                      "compile_s": compile_s[n]}
        rows.append(row)
        print(f"T={T}: " + ", ".join(f"{n} {row[n]['min_s']:.4f} s" for n in compiled),
              flush=True)
    first = rows[0]
    growth = {f"{r['tokens']}/{first['tokens']}": {
        "tokens": r["tokens"] / first["tokens"],
        **{n: r[n]["min_s"] / first[n]["min_s"] for n in ("deltanet", "attention") if n in r}}
        for r in rows[1:]}
    publish_json({"command": command_line(), "runtime": describe(),
                  "backend": jax.default_backend(), "device": str(jax.devices()[0]),
                  "note": args.note,
                  "layer": {"d_model": D, "key_heads": args.key_heads, "value_heads": H,
                            "head_dim": hd, "chunk": args.chunk, "batch": 1,
                            "dtype": "float32", "repeats": args.repeats},
                  "rows": rows, "growth_vs_first": growth,
                  "max_rss_bytes": 1024 * resource.getrusage(resource.RUSAGE_SELF).ru_maxrss},
                 args.out)


if __name__ == "__main__":
    main()
