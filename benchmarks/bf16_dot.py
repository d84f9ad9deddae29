"""Why the bfloat16 HF forward is slower than float32 on XLA:CPU: where the bf16 dots run.

    python -m benchmarks.bf16_dot --out results/bf16_dot.json

Three forms of the same expert matmuls (E experts, each (rows, a) x (a, b)), bfloat16 inputs,
float32 products, against the float32 forms of the same shapes:

- ``whole``: one batched dot of whole buffers (``einsum('eta,eab->etb')``): XLA:CPU hands it
  to its YNNPACK bf16 kernel (AVX-512-BF16 where the CPU has it);
- ``loop``: a ``fori_loop`` over the experts, each taking its slice ``w[e]``: the form of
  dynjax's dropless expert loop (``dynjax.models.dispatch``);
- ``whole_f32`` / ``loop_f32``: the same programs on float32 copies.

For each compiled program: seconds (medians of interleaved rounds), and how many
``convert`` instructions of the optimized HLO widen the whole (E, a, b) stack (XLA widens
the bf16 operands of a dot it cannot run in bf16, and hoists the widening out of the loop:
the whole stack is converted on every call). Prints JSON (and writes ``--out``).
"""
from dynjax.runtime import describe, setup  # noqa: E402  one runtime set-up for every program
setup(__name__)
import argparse  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dynjax.jsonio import command_line, publish_json  # noqa: E402
from dynjax.measure.latency import paired_times  # noqa: E402


def programs(E: int, rows: int, a: int, b: int):
    """name -> (jitted fn, its arguments)."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((E, rows, a)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((E, a, b)), jnp.bfloat16)

    def whole(x, w):
        return jnp.einsum("eta,eab->etb", x, w, preferred_element_type=jnp.float32)

    def loop(x, w):
        def body(e, out):
            y = jnp.dot(x[e], w[e], preferred_element_type=jnp.float32)
            return jax.lax.dynamic_update_slice_in_dim(out, y[None], e, 0)
        return jax.lax.fori_loop(0, E, body, jnp.zeros((E, rows, b), jnp.float32))

    x32, w32 = x.astype(jnp.float32), w.astype(jnp.float32)
    return {"whole": (jax.jit(whole), (x, w)), "loop": (jax.jit(loop), (x, w)),
            "whole_f32": (jax.jit(whole), (x32, w32)), "loop_f32": (jax.jit(loop), (x32, w32))}


def stack_widenings(fn, args, shape) -> int:
    """``convert`` instructions in the optimized HLO whose result is the whole f32 stack."""
    text = fn.lower(*args).compile().as_text()
    pattern = re.compile(r"= f32\[" + ",".join(map(str, shape)) + r"\]\{[^}]*\} convert\(")
    return len(pattern.findall(text))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--rows", type=int, default=64, help="rows per expert")
    p.add_argument("--a", type=int, default=1024)
    p.add_argument("--b", type=int, default=512)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--out")
    args = p.parse_args(argv)
    progs = programs(args.experts, args.rows, args.a, args.b)
    load_before = os.getloadavg()
    times = paired_times({n: (lambda f=f, xs=xs: f(*xs)) for n, (f, xs) in progs.items()},
                         args.repeats)
    flops = 2 * args.experts * args.rows * args.a * args.b
    out = {"command": command_line(), "runtime": describe(),
           "shape": {"experts": args.experts, "rows_per_expert": args.rows, "a": args.a,
                     "b": args.b}, "load_average_before": load_before,
           "load_average_after": os.getloadavg(), "programs": {}}
    for n, (f, xs) in progs.items():
        t = times[n]
        out["programs"][n] = {**t, "gflops_per_s": flops / t["median_s"] / 1e9,
                              "stack_widenings": stack_widenings(f, xs, (args.experts, args.a,
                                                                         args.b))}
    med = {n: t["median_s"] for n, t in times.items()}
    out["ratios"] = {"whole_bf16_over_f32_speed": med["whole_f32"] / med["whole"],
                     "loop_bf16_over_f32_speed": med["loop_f32"] / med["loop"],
                     "loop_over_whole_bf16_speed": med["whole"] / med["loop"]}
    publish_json(out, args.out)


if __name__ == "__main__":
    main()
