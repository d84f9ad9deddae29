"""Actual execution of sequence models: blocks executed per token, and FLOPs per forward.

Two FLOP counts, always reported side by side and never mixed up:

- ``compiled_flops``: what XLA's cost analysis of the compiled program says. It counts every
  op (matmuls, softmax, norms, activations), but a ``lax.scan`` / while body only ONCE, not
  once per iteration. So count an unrolled program: build the model with
  ``scan_layers=False`` (``flop_report`` does this and says so).
- ``analytic_forward_flops``: 2 x multiply-accumulates of the matmuls only (projections,
  MLP, attention scores and values, router, LM head), for the shapes the program really
  runs: a MoD block's attention and MLP run on k = floor(c*T) gathered tokens. Attention is
  counted over the full T x T (or k x k) score matrix, as the program computes it, not the
  causal half.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from dynjax.measure import routing
from dynjax.models import build, mod
from dynjax.models.transformer import ModelConfig


def executed_blocks(model, params, tokens) -> np.ndarray:
    """(B, T) int: how many blocks each token executed in one forward."""
    cfg = model.cfg
    B, T = tokens.shape
    if cfg.family == "mod":
        n_dense = cfg.n_layers - len(mod.mod_layer_ids(cfg))
        if cfg.variant == "dense":
            return np.full((B, T), cfg.n_layers)
        entered = np.asarray(routing.routing_stats(model, params, tokens)["entered"])
        return n_dense + entered.sum(axis=0)
    depth = cfg.fixed_depth if cfg.variant == "fixed_depth" else cfg.n_layers
    return np.full((B, T), depth)  # gate families execute every block they build


def execution_summary(counts: np.ndarray, n_layers: int) -> dict:
    """Mean executed blocks per token and the histogram over 0..n_layers."""
    counts = np.asarray(counts).ravel()
    hist = np.bincount(counts, minlength=n_layers + 1)
    return {"mean_executed_blocks": float(counts.mean()), "n_layers": n_layers,
            "histogram": hist.tolist(), "tokens": int(counts.size)}


def compiled_cost(fn, *args) -> dict:
    """XLA's cost analysis of ``jax.jit(fn)`` compiled for ``args``: flops and bytes
    accessed. A scan/while body is counted once: pass an unrolled program."""
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per computation
        cost = cost[0]
    return {"flops": float(cost.get("flops", float("nan"))),
            "bytes_accessed": float(cost.get("bytes accessed", float("nan")))}


def compiled_flops(fn, *args) -> float:
    return compiled_cost(fn, *args)["flops"]


def _block_flops(cfg: ModelConfig, n: int) -> int:
    """One block on n tokens: q, k, v, out projections, MLP, scores and values over n keys."""
    d = cfg.d_model
    return 2 * n * (4 * d * d + 2 * d * cfg.d_ff) + 2 * 2 * n * n * d


def analytic_forward_flops(cfg: ModelConfig, batch: int, seq_len: int) -> dict:
    """Matmul FLOPs (2 x MACs) of one forward over (batch, seq_len), by part."""
    T, d = seq_len, cfg.d_model
    mod_ids = mod.mod_layer_ids(cfg) if cfg.family == "mod" else ()
    n_blocks = cfg.fixed_depth if cfg.variant == "fixed_depth" else cfg.n_layers
    dense_blocks = (n_blocks - len(mod_ids)) * _block_flops(cfg, T)
    mod_blocks = router = 0
    if mod_ids:
        k = mod.capacity(cfg, T)
        mod_blocks = len(mod_ids) * _block_flops(cfg, k)
        router = len(mod_ids) * 2 * T * d
    head = 2 * T * d * cfg.vocab_size
    parts = {"dense_blocks": dense_blocks, "mod_blocks": mod_blocks, "router": router,
             "head": head}
    parts = {k: batch * v for k, v in parts.items()}
    parts["total"] = sum(parts.values())
    return parts


def flop_report(cfg: ModelConfig, batch: int, seq_len: int, params=None) -> dict:
    """Compiled (unrolled program) and analytic FLOPs of one record forward."""
    cfg = dataclasses.replace(cfg, scan_layers=False)
    model = build(cfg)
    tokens = jnp.zeros((batch, seq_len), jnp.int32)
    if params is None:
        params = jax.eval_shape(model.init, jax.random.key(0), tokens)
    compiled = compiled_cost(lambda p, t: model.apply(p, t)[0], params, tokens)
    analytic = analytic_forward_flops(cfg, batch, seq_len)
    return {"compiled_flops": compiled["flops"],
            "compiled_bytes_accessed": compiled["bytes_accessed"],
            "compiled_counted_on": "unrolled layers "
            "(scan_layers=False), XLA cost analysis, all ops",
            "analytic_flops": analytic["total"], "analytic_parts": analytic,
            "analytic_counts": "matmuls only, 2 x MACs"}
