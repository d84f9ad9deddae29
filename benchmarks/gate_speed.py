"""Does gating save time? Latency of dense, masked and structured gating beside RelMAC.

    python benchmarks/gate_speed.py --out=runs/gate_speed.json

For an MLP 784-H-H-10 (default H=1024) at batch 1 and 256, one jitted forward each:

- ``dense``             every unit computed.
- ``masked``            DynamicGate as trained: every unit computed, then multiplied by the
                        hard mask (plus the GateNet). RelMAC falls, latency does not.
- ``structured_<mode>`` the capacity mode's fast path (``structured_forward``): only the open
                        blocks run, as smaller dense matmuls; ``example`` picks blocks per
                        example (gathers per-example weights), ``batch`` once per batch.

RelMAC is measured with :mod:`dynjax.measure.macs` on the same inputs (random-init weights
with gates biased to about half open; latency does not depend on trained values).
``latency_vs_mac`` = (1 - t / t_dense) / (1 - RelMAC): the share of the MAC saving that
shows on the clock (the issue's aim: >= 0.7 at batch 256). Timings: median of ``--repeats``
calls after warm-up, float32. ``max_abs_diff_vs_masked`` is float error unless top-k picked
another block somewhere, which ``topk_margin`` (see there) tells.
"""
from __future__ import annotations

from dynjax.runtime import describe, setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse
import json
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from dynjax.measure import macs
from dynjax.models.gated_mlp import GatedMLP, MLPConfig, structured_forward
from dynjax.jsonio import command_line, write_json_atomic


def median_latency(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compile and warm up
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def topk_margin(cfg, probs) -> float:
    """The smallest relative gap, over examples and layers, between the k-th and (k+1)-th
    block probability that top-k ranks (per example, or their batch mean). The fast path
    computes layer l >= 1's gate logits with another reduction than the masked forward (per
    example: a batched einsum over gathered weights); where this gap is below that float
    error, the two pick different blocks and their outputs differ by a whole block's
    contribution, not by rounding."""
    from dynjax.models.gated_mlp import blocks_kept

    gaps = []
    for p, n in zip(probs, cfg.hidden):
        q = np.asarray(p, np.float64)
        q = q.mean(axis=0, keepdims=True) if cfg.capacity_mode == "batch" else q
        k = blocks_kept(cfg, n)
        if k >= q.shape[-1]:
            continue
        s = -np.sort(-q, axis=-1)
        gaps.append(float(np.min((s[:, k - 1] - s[:, k]) / s[:, k - 1])))
    return min(gaps) if gaps else float("inf")


def relmac(model, params, x):
    _, _, aux = model.apply(params, x, with_aux=True)
    return macs.report(model.dims, macs.model_mac_sums(model, aux["open"]), x.shape[0])["relmac"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--keep", type=float, default=0.25, help="structured keep_fraction")
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--batches", default="1,256")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--max-example-batch", type=int, default=1024,
                    help="skip structured_example above this batch (it gathers a weight copy "
                         "per example: batch x H x keep*H floats)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    base = dict(in_dim=784, hidden=(args.hidden, args.hidden), n_classes=10, gate_hidden=16,
                gate_bias_init=0.0, block_size=args.block, keep_fraction=args.keep)
    key = jax.random.key(0)
    results = {"command": command_line(), "runtime": describe(), "device": str(jax.devices()[0]), "platform": platform.platform(),
               "jax": jax.__version__, "config": base, "repeats": args.repeats, "runs": []}
    for batch in [int(b) for b in args.batches.split(",")]:
        x = jax.random.uniform(jax.random.key(batch), (batch, 784))
        dense = GatedMLP(MLPConfig(**base, variant="dense"))
        p_dense = dense.init(key, x)
        t_dense = median_latency(jax.jit(lambda p, x: dense.apply(p, x)[0]), p_dense, x,
                                 repeats=args.repeats)
        rows = [{"batch": batch, "mode": "dense", "latency_s": t_dense, "relmac": 1.0}]
        masked = GatedMLP(MLPConfig(**base, variant="dgate"))
        p_m = masked.init(key, x)
        rows.append({"batch": batch, "mode": "masked", "relmac": relmac(masked, p_m, x),
                     "latency_s": median_latency(jax.jit(lambda p, x: masked.apply(p, x)[0]),
                                                 p_m, x, repeats=args.repeats)})
        for mode in ("example", "batch") if batch <= args.max_example_batch else ("batch",):
            cfg = MLPConfig(**base, variant="structured", capacity_mode=mode)
            model = GatedMLP(cfg)
            p_s = model.init(key, x)
            fast = jax.jit(lambda p, x, cfg=cfg: structured_forward(cfg, p, x))
            masked_logits, coeffs = model.apply(p_s, x)
            err = float(jnp.max(jnp.abs(fast(p_s, x) - masked_logits)))
            rows.append({"batch": batch, "mode": f"structured_{mode}",
                         "relmac": relmac(model, p_s, x), "max_abs_diff_vs_masked": err,
                         "topk_margin": topk_margin(cfg, coeffs["p"]),
                         "latency_s": median_latency(fast, p_s, x, repeats=args.repeats)})
        for r in rows:
            saving = 1 - r["relmac"]
            r["speedup"] = t_dense / r["latency_s"]
            r["latency_vs_mac"] = (1 - r["latency_s"] / t_dense) / saving if saving > 0 else None
            print(json.dumps(r))
        results["runs"].extend(rows)
    if args.out:
        write_json_atomic(args.out, results)


if __name__ == "__main__":
    main()
