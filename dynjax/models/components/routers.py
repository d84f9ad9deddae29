"""How an MoE layer picks and weighs its experts (``Config.router``), each a namespace of:

- ``rows(cfg, prefix)``: its parameters (the router weight, any selection bias);
- ``scores(cfg, p, x)``: float32 (.., E), the coefficient the layer records (the
  ``dynjax.coeffs`` site: what an audit swaps or flattens);
- ``select(cfg, p, scores)``: top-k experts (.., k) and their float32 weights from given
  scores;
- ``float32_params``: its parameters kept in float32 in a bfloat16 model. Replay runs ``select`` on the given scores, so any rule the checkpoint adds on
  top of the scores (a selection bias, group limits, a scale) applies to replayed scores
  too;
- ``distribution(cfg, scores)``: the router's probabilities over all experts (.., E) (the
  scorecard's routing entropy).

"softmax_topk" (Mixtral, OLMoE, Qwen-MoE): p = softmax(x W); the k largest, renormalised
to sum 1 when ``norm_topk_prob``.

"grouped_topk" (DeepSeek-V2/V3, Kimi-K2, GLM-4.5): in float32, s = sigmoid(x W)
(``router_score`` "sigmoid"; DeepSeek-V2: "softmax") is recorded. Selection ranks
c = s + b (``router_bias``: the checkpoint's e_score_correction_bias, for the selection
only); with ``n_group`` > 1 the experts form n_group equal groups, a group's score is the
sum of its top-2 c (``router_group_score`` "top2_sum"; DeepSeek-V2's group_limited_greedy:
"max"), and only the ``topk_group`` best groups stay eligible; then the top-k eligible
c. Their weights are the unbiased s, renormalised (w / (sum w + 1e-20)) when
``norm_topk_prob``, times ``routed_scaling_factor``.

"topk_softmax" (gpt-oss): logits z = x W + b (a bias per expert, part of the logits, so it
acts on selection and weights alike) recorded; the k largest logits, then a softmax over
those k only.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

F32 = jnp.float32


class SoftmaxTopK:
    """p = softmax(x W) recorded; top-k of p, optionally renormalised."""

    float32_params = ()

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

    @staticmethod
    def distribution(cfg, probs):
        return probs

class GroupedTopK:
    """Scores s recorded; selection by s + bias within the best groups (docstring above)."""

    float32_params = ("router", "router_bias")

    @staticmethod
    def rows(cfg, M):
        rows = [(M + ("router",), (cfg.hidden_size, cfg.num_experts), ("embed", None))]
        if cfg.router_bias:
            rows.append((M + ("router_bias",), (cfg.num_experts,), (None,)))
        return rows

    @staticmethod
    def scores(cfg, p, x):
        logits = x.astype(F32) @ p["router"].astype(F32)
        if cfg.router_score == "sigmoid":
            return jax.nn.sigmoid(logits)
        return jax.nn.softmax(logits, axis=-1)

    @staticmethod
    def select(cfg, p, scores):
        choice = scores + p["router_bias"].astype(F32) if cfg.router_bias else scores
        G = cfg.n_group
        if G > 1 and cfg.topk_group < G:
            grouped = choice.reshape(*choice.shape[:-1], G, cfg.num_experts // G)
            if cfg.router_group_score == "max":
                group = jnp.max(grouped, axis=-1)
            else:
                group = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)
            kept = jax.lax.top_k(group, cfg.topk_group)[1]
            keep = jnp.sum(jax.nn.one_hot(kept, G, dtype=jnp.int32), axis=-2) > 0
            eligible = jnp.repeat(keep, cfg.num_experts // G, axis=-1)
            choice = jnp.where(eligible, choice, -jnp.inf)
        experts = jax.lax.top_k(choice, cfg.top_k)[1]
        weights = jnp.take_along_axis(scores, experts, axis=-1)
        if cfg.norm_topk_prob:
            weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
        return experts, weights * F32(cfg.routed_scaling_factor)



class TopKSoftmax:
    """z = x W + b recorded; top-k of z, softmax over the k."""

    float32_params = ()

    @staticmethod
    def rows(cfg, M):
        return SoftmaxTopK.rows(cfg, M) + [(M + ("router_bias",), (cfg.num_experts,), (None,))]

    @staticmethod
    def scores(cfg, p, x):
        dt = cfg.compute_dtype
        return (x @ p["router"].astype(dt) + p["router_bias"].astype(dt)).astype(F32)

    @staticmethod
    def select(cfg, p, logits):
        top, experts = jax.lax.top_k(logits, cfg.top_k)
        return experts, jax.nn.softmax(top, axis=-1)

    @staticmethod
    def distribution(cfg, logits):
        return jax.nn.softmax(logits, axis=-1)


ROUTERS = {"softmax_topk": SoftmaxTopK, "grouped_topk": GroupedTopK,
           "topk_softmax": TopKSoftmax}
