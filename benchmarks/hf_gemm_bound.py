"""The matmul floor of an HF MoE forward on this machine: how fast could any framework be?

``forward_matmuls(cfg, batch, T)`` lists the forward's matmuls at its own shapes (q/k/v/o, the
attention square per head, the router, every expert at the mean rows per expert T x k / E,
the head); :func:`bound` times each shape in JAX and in PyTorch in the run's dtype and
prices it at the faster of the two. ``bound_s`` is then the forward if it were nothing but
its matmuls at microbenchmark speed: a contender's forward over it says how much is left
to win, and a goal below it is out of reach on this CPU. Used by ``vs_transformers.py``.
"""
from __future__ import annotations

import statistics

import jax
import jax.numpy as jnp
import numpy as np
import torch

from benchmarks import vs_pytorch
from dynjax.models import matmul


def forward_matmuls(cfg: dict, batch: int, T: int) -> dict:
    """name -> (lhs shape, rhs shape, count per forward) of an OLMoE / Qwen3-MoE forward
    over ``batch`` rows of T tokens (batched: (b, m, k) x (b, k, n))."""
    d, h, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    hd = cfg.get("head_dim") or d // h
    kv = cfg.get("num_key_value_heads") or h
    E, k = cfg["num_experts"], cfg["num_experts_per_tok"]
    f = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    N, bh = batch * T, batch * h
    rows = max(1, N * k // E)
    return {"q_o": ((N, d), (d, h * hd), 2 * L), "k_v": ((N, d), (d, kv * hd), 2 * L),
            "scores": ((bh, T, hd), (bh, hd, T), L), "values": ((bh, T, T), (bh, T, hd), L),
            "router": ((N, d), (d, E), L),
            "expert_in": ((rows, d), (d, f), 2 * E * L), "expert_out": ((rows, f), (f, d), E * L),
            "head": ((N, d), (d, cfg["vocab_size"]), 1)}


def flops(lhs, rhs) -> float:
    return 2.0 * float(np.prod(lhs)) * rhs[-1]


def _seconds(fn, min_s: float = 0.2, rounds: int = 3) -> float:
    """Median over ``rounds`` of vs_pytorch's ``timed``: the mean of calls filling ``min_s``
    after an untimed one."""
    return statistics.median(vs_pytorch.timed(fn, 1, min_s) for _ in range(rounds))


def _timer(framework: str, lhs, rhs, dtype: str):
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in (lhs, rhs))
    if framework == "jax":
        x, y = (jnp.asarray(v, dtype) for v in (a, b))
        mm = jax.jit(matmul.mm)   # bfloat16: the float32-result dot dynjax's models take
        return lambda: mm(x, y).block_until_ready()
    x, y = (torch.from_numpy(v).to(getattr(torch, dtype)) for v in (a, b))

    def run():
        with torch.no_grad():
            torch.matmul(x, y)
    return run


def bound(cfg: dict, batch: int, T: int, dtype: str) -> dict:
    """Per matmul shape: FLOPs per forward and each framework's rate; ``bound_s``: the
    forward's matmuls at the faster rate of each shape."""
    shapes, total, bound_s = {}, 0.0, 0.0
    for name, (lhs, rhs, count) in forward_matmuls(cfg, batch, T).items():
        rate = {fw: flops(lhs, rhs) / _seconds(_timer(fw, lhs, rhs, dtype))
                for fw in ("jax", "torch")}
        fl = count * flops(lhs, rhs)
        shapes[name] = {"lhs": list(lhs), "rhs": list(rhs), "per_forward": count,
                        "flops": fl, "flops_per_s": rate}
        total += fl
        bound_s += fl / max(rate.values())
    return {"dtype": dtype, "matmul_flops": total, "bound_s": bound_s, "shapes": shapes,
            "note": "the forward's matmuls timed one shape at a time (experts at the mean "
                    "rows per expert, attention over the full T x T square as eager "
                    "attention computes it), each at the faster of jax.jit(matmul.mm) and "
                    "torch.matmul in this dtype; medians of 3 rounds of calls filling 0.2 s"}
