"""How an MoE layer picks and weighs its experts (``Config.router``), each a namespace of:

- ``rows(cfg, prefix)``: its parameters (the router weight, any selection bias);
- ``scores(cfg, p, x)``: float32 (.., E), the coefficient the layer records (the
  ``dynjax.coeffs`` site: what an audit swaps or flattens);
- ``select(cfg, p, scores)``: top-k experts (.., k) and their float32 weights from given
  scores. Replay runs ``select`` on the given scores, so any rule the checkpoint adds on
  top of the scores (a selection bias, group limits, a scale) applies to replayed scores
  too.

"softmax_topk" (Mixtral, OLMoE, Qwen-MoE): p = softmax(x W); the k largest, renormalised
to sum 1 when ``norm_topk_prob``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

F32 = jnp.float32


class SoftmaxTopK:
    """p = softmax(x W) recorded; top-k of p, optionally renormalised."""

    @staticmethod
    def rows(cfg, M):
        return [(M + ("router",), (cfg.hidden_size, cfg.num_experts), ("embed", None))]

    @staticmethod
    def scores(cfg, p, x):
        return jax.nn.softmax((x @ p["router"].astype(cfg.compute_dtype)).astype(F32), axis=-1)

    @staticmethod
    def select(cfg, p, probs):
        weights, experts = jax.lax.top_k(probs, cfg.top_k)
        if cfg.norm_topk_prob:
            weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
        return experts, weights


ROUTERS = {"softmax_topk": SoftmaxTopK}
