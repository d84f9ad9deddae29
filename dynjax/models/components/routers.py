"""How an MoE layer picks and weighs its experts (``Config.router``), each a namespace of
``rows``, ``scores`` (float32: the coefficient the layer records), ``select`` (top-k experts
and weights from given scores, so replay applies the checkpoint's selection bias, group
limits and scale to replayed scores too), ``float32_params`` and ``distribution``.

Routers: "softmax_topk" (Mixtral, OLMoE, Qwen-MoE), "grouped_topk" (DeepSeek-V2/V3,
Kimi-K2, GLM-4.5), "topk_softmax" (gpt-oss), "hash" (Hash Layers; DeepSeek-V4's first
layers), and DeepSeek-V3's auxiliary-loss-free bias update (:func:`bias_update`).
Depth: docs/moe.md#routers-dynjaxmodelscomponentsrouterspy
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dynjax.models.components import norms

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
    def select(cfg, p, probs, tokens=None):
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
    def select(cfg, p, scores, tokens=None):
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
        return experts, weigh(scores, experts, cfg.norm_topk_prob, cfg.routed_scaling_factor)

    @staticmethod
    def distribution(cfg, scores):
        return normalised(scores)


def normalised(scores):
    """Sigmoid scores as a distribution over all experts (softmax scores are one already)."""
    return scores / jnp.sum(scores, axis=-1, keepdims=True)


def weigh(scores, experts, renormalise: bool, scale: float):
    """The chosen experts' weights: their scores, renormalised (w / (sum w + 1e-20)) when
    ``renormalise``, times ``scale`` (DeepSeek's routed_scaling_factor)."""
    weights = jnp.take_along_axis(scores, experts, axis=-1)
    if renormalise:
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    return weights * F32(scale)



class NormedSoftmaxTopK:
    """"normed_softmax_topk" (Gemma-4): its own gain-less RMSNorm of its input (the residual
    stream, not the experts' normed input), times a learned ``router_scale`` (D,) and
    D^-1/2, then p = softmax(x W) recorded; the k largest, renormalised to sum 1, each times
    its expert's learned ``expert_scale`` (E,) (a weight only: the selection is p's top-k)."""

    float32_params = ()

    @staticmethod
    def rows(cfg, M):
        return SoftmaxTopK.rows(cfg, M) + [
            (M + ("router_scale",), (cfg.hidden_size,), ("embed",)),
            (M + ("expert_scale",), (cfg.num_experts,), (None,))]

    @staticmethod
    def scores(cfg, p, x):
        dt = cfg.compute_dtype
        x = norms.rms_norm(x, None, cfg.rms_norm_eps) * p["router_scale"].astype(dt) \
            * jnp.asarray(cfg.hidden_size ** -0.5, dt)
        return SoftmaxTopK.scores(cfg, p, x)

    @staticmethod
    def select(cfg, p, probs, tokens=None):
        weights, experts = jax.lax.top_k(probs, cfg.top_k)
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
        return experts, weights * p["expert_scale"].astype(F32)[experts]

    distribution = SoftmaxTopK.distribution


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
    def select(cfg, p, logits, tokens=None):
        top, experts = jax.lax.top_k(logits, cfg.top_k)
        return experts, jax.nn.softmax(top, axis=-1)

    @staticmethod
    def distribution(cfg, logits):
        return jax.nn.softmax(logits, axis=-1)


def table_experts(table, tokens):
    """The experts (.., k) a token-id table (V, k) gives ``tokens`` (..) (stored as float32 in
    a trained model so the gradient passes it by; its values are whole numbers)."""
    if tokens is None:
        raise ValueError("a hash router selects by token id: pass the tokens")
    return jnp.take(table.astype(jnp.int32), tokens, axis=0)


def hash_table(key, vocab: int, num_experts: int, k: int):
    """A fresh token-id table (vocab, k) float32: token ids in a random order (``key``) each
    take the k distinct experts with the fewest ids so far (ties: a random expert order per
    id), so every expert serves vocab k / E ids, give or take one."""
    order_key, tie_key = jax.random.split(key)
    order = jax.random.permutation(order_key, vocab)
    ties = jax.random.uniform(tie_key, (vocab, num_experts))

    def take(counts, row):
        token, tie = row
        chosen = jax.lax.top_k(-(counts.astype(F32) + tie), k)[1]
        return counts.at[chosen].add(1), (token, chosen)
    _, (tokens, chosen) = jax.lax.scan(take, jnp.zeros(num_experts, jnp.int32), (order, ties))
    return jnp.zeros((vocab, k), F32).at[tokens].set(chosen.astype(F32))


class Hash:
    """Experts from ``tid2eid[token]``; s recorded, the table's experts weighed by it."""

    float32_params = ("tid2eid",)
    frozen = ("tid2eid",)          # no gradient, no optimizer step: kept as initialised

    @staticmethod
    def rows(cfg, M):
        return SoftmaxTopK.rows(cfg, M) + [(M + ("tid2eid",), (cfg.vocab_size, cfg.top_k),
                                            (None, None))]

    @staticmethod
    def scores(cfg, p, x):
        logits = (x @ p["router"].astype(cfg.compute_dtype)).astype(F32)
        if cfg.router_score == "sigmoid":
            return jax.nn.sigmoid(logits)
        return jax.nn.softmax(logits, axis=-1)

    @staticmethod
    def select(cfg, p, scores, tokens=None):
        experts = table_experts(p["tid2eid"], tokens)
        return experts, weigh(scores, experts, cfg.norm_topk_prob, cfg.routed_scaling_factor)

    @staticmethod
    def distribution(cfg, scores):
        return normalised(scores)


def bias_update(bias, experts, num_experts: int, rate: float):
    """DeepSeek-V3's auxiliary-loss-free step: b_i + rate sign(mean load - load_i), the loads
    counted over every (token, choice) of ``experts`` (.., k); float32 (E,)."""
    load = jnp.sum(jax.nn.one_hot(experts, num_experts, dtype=F32),
                   axis=tuple(range(experts.ndim)))
    return bias + F32(rate) * jnp.sign(jnp.mean(load) - load)


ROUTERS = {"softmax_topk": SoftmaxTopK, "normed_softmax_topk": NormedSoftmaxTopK,
           "grouped_topk": GroupedTopK,
           "topk_softmax": TopKSoftmax, "hash": Hash}
