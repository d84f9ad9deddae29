"""Residual-gate family: h[l+1, t] = h[l, t] + g[l, t] * F_l(h[l])[t].

Variants (``dense``, ``uniform``, ``layer_static``, ``feature_gate``, ``fixed_depth``) as
in the Frozen-Controller Audit paper. FeatureGate's four features are computed under
``stop_gradient``: the controller reads the backbone but never shapes it through its inputs.
Every gated variant records ``{"gate": (layer, example, token)}``, so one audit serves all,
and still executes every block.
Depth: docs/models.md#the-residual-gate-family-dynjaxmodelsgatespy
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from dynjax import coeffs as coeffs_lib
from dynjax.coeffs import Axes
from dynjax.models.transformer import (REMAT_SAVED, Block, Head, ModelConfig, attention_scores,
                                       embed_tokens, scan_layers)

VARIANTS = ("dense", "uniform", "layer_static", "feature_gate", "fixed_depth")
GATE_AXES = Axes(("layer", "example", "token"))


def schema(cfg: ModelConfig):
    """The coefficient schema of a gate model: empty for dense and fixed_depth."""
    return {} if cfg.variant in ("dense", "fixed_depth") else {"gate": GATE_AXES}


def uniform_attention(cfg: ModelConfig, B: int, T: int):
    """Layer 0's KL reference, the uniform distribution over visible keys, in the form a
    layer hands to the next: (q, k, lse) with zero queries and keys, so every visible
    logit is 0 and lse = log(visible keys)."""
    zeros = jnp.zeros((B, T, cfg.n_heads, cfg.head_dim), cfg.compute_dtype)
    lse = jnp.log(jnp.arange(1, T + 1, dtype=jnp.float32))
    return zeros, zeros, jnp.broadcast_to(lse, (B, cfg.n_heads, T))


def row_features(logits, lse, logp_prev):
    """Per head and query, from masked float32 logits (B, H, n, m), their log-sum-exp and the
    previous layer's log-probabilities over the same keys: the entropy, the KL to the
    previous layer's attention and the normalised log-partition, (B, H, n, 3), gradient-free."""
    logits, lse, logp_prev = jax.lax.stop_gradient((logits, lse, logp_prev))
    logp = logits - lse[..., None]                     # masked -> ~-1e30
    p = jnp.exp(logp)                                  # exactly 0 where masked
    entropy = -jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)
    kl = jnp.sum(jnp.where(p > 0, p * (logp - logp_prev), 0.0), axis=-1)
    visible = jnp.sum(p > 0, axis=-1).astype(jnp.float32)
    return jnp.stack([entropy, kl, lse / jnp.log(jnp.maximum(visible, 2.0))], axis=-1)


def attention_row_features(prev):
    """``row_stats`` for causal_attention: ``row_features`` of a block of queries, the
    previous layer's logits recomputed from ``prev`` = its (q, k, lse) for the same block."""
    q_prev, k_prev, lse_prev = jax.lax.stop_gradient(prev)

    def stats(q0, logits, lse):
        n, m = logits.shape[2:]
        logp_prev = (attention_scores(q_prev[:, q0:q0 + n], k_prev[:, :m])
                     - lse_prev[:, :, q0:q0 + n, None])
        return row_features(logits, lse, logp_prev)
    return stats


def online_row_features(q, k, positions, prev, block=128):
    """``attention_row_features`` for a whole layer without its attention probabilities:
    keys in blocks of ``block`` with an online softmax (running max m, sum l = sum e^(s-m),
    and the e^(s-m)-weighted sums of s and of the previous layer's logits), so no array
    exceeds (B, H, T, block). Entropy = lse - E[s]; KL = E[s] - lse - E[s_prev] + lse_prev.
    Returns the features (B, H, T, 3) and this layer's lse (B, H, T)."""
    (q, k, positions), (q_prev, k_prev, lse_prev) = jax.lax.stop_gradient(
        ((q, k, positions), prev))
    B, T, H, _ = q.shape
    m = jnp.full((B, H, T), -jnp.inf)
    l = es = es_prev = visible = jnp.zeros((B, H, T))
    for j in range(0, k.shape[1], block):
        s = attention_scores(q, k[:, j:j + block])
        s_prev = attention_scores(q_prev, k_prev[:, j:j + block])
        mask = (positions[:, None, j:j + block] <= positions[:, :, None])[:, None]
        m_new = jnp.maximum(m, jnp.max(jnp.where(mask, s, -jnp.inf), axis=-1))
        alpha = jnp.exp(m - m_new)
        e = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
        l, m = l * alpha + e.sum(-1), m_new
        es = es * alpha + jnp.sum(e * jnp.where(mask, s, 0.0), axis=-1)
        es_prev = es_prev * alpha + jnp.sum(e * jnp.where(mask, s_prev, 0.0), axis=-1)
        visible = visible + mask.sum(-1)
    lse = m + jnp.log(l)
    mean_s, mean_prev = es / l, es_prev / l
    feats = jnp.stack([lse - mean_s, mean_s - lse - mean_prev + lse_prev,
                       lse / jnp.log(jnp.maximum(visible, 2.0))], axis=-1)
    return feats, lse


def attention_features(per_head, update, h):
    """The four per-token controller features, (B, T, 4), float32 and gradient-free: the
    per-head row features (B, H, T, 3) averaged over heads, and ||update|| / ||h||."""
    per_head, update, h = jax.lax.stop_gradient((per_head, update, h))
    upd = jnp.linalg.norm(update.astype(jnp.float32), axis=-1)
    res = jnp.linalg.norm(h.astype(jnp.float32), axis=-1)
    rel = upd / (res + 1e-6)
    return jnp.concatenate([per_head.mean(axis=1), rel[..., None]], axis=-1)


class Controller(nn.Module):
    """Small MLP from the four features to a bounded gate; starts at g = gate_max / 2."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, features):
        z = nn.Dense(self.cfg.gates.controller_hidden, name="hidden", kernel_init=nn.with_logical_partitioning(
            nn.initializers.lecun_normal(), (None, None)))(features)
        z = nn.Dense(1, name="out", kernel_init=nn.with_logical_partitioning(
            nn.initializers.zeros, (None, None)))(nn.gelu(z))
        return self.cfg.gates.gate_max * jax.nn.sigmoid(z[..., 0])


class GateLayer(nn.Module):
    """One block plus its residual rule. Carry: (h, positions, the previous layer's attention
    as (q, k, lse); feature_gate only).

    ``given``: this layer's :class:`~dynjax.coeffs.Given` (values (B, T) or None);
    ``static`` is the uniform / layer_static gate, which stands in for the controller.
    """

    cfg: ModelConfig

    @nn.compact
    def __call__(self, carry, xs):
        given, static = xs
        h, positions, prev = carry
        fg = self.cfg.variant == "feature_gate"
        update, (q, k, lse, per_head) = Block(self.cfg, name="block")(
            h, positions, row_stats=attention_row_features(prev) if fg else None)
        if fg and per_head is None:  # a fused attention: the features without probabilities
            per_head, lse = online_row_features(q, k, positions.index, prev,
                                                 self.cfg.attn_block or 128)
        if self.cfg.variant in ("dense", "fixed_depth"):
            return (h + update, positions, prev), None
        if fg:
            features = attention_features(per_head, update, h)
            prev = (q, k, lse)
            features = checkpoint_name(features, REMAT_SAVED)  # remat: not recomputed
            static = Controller(self.cfg, name="controller")(features)
        g = coeffs_lib.site(static, given)
        h = h + g[..., None].astype(h.dtype) * update
        return (h, positions, prev), g


class GatedDecoder(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens, given=None):
        """``given``: a :class:`~dynjax.coeffs.Given` of ``{"gate": (layer, B, T)}`` or None."""
        cfg = self.cfg
        B, T = tokens.shape
        h, positions = embed_tokens(cfg, tokens)
        n_layers = cfg.gates.fixed_depth if cfg.variant == "fixed_depth" else cfg.n_layers
        gated = cfg.variant not in ("dense", "fixed_depth")
        static = None
        if cfg.variant in ("uniform", "layer_static"):
            static = jnp.broadcast_to(self.static_gate()[:, None, None], (n_layers, B, T))
        prev = uniform_attention(cfg, B, T) if cfg.variant == "feature_gate" else None
        given = coeffs_lib.part(given, lambda c: c["gate"], n_layers) if gated else None
        layers = scan_layers(GateLayer, cfg, n_layers)
        (h, _, _), recorded = layers((h, positions, prev), (given, static))
        logits = Head(cfg, name="head")(h)
        return logits, ({} if recorded is None else {"gate": recorded})

    def static_gate(self):
        """(layers,) gate values of the uniform and layer_static variants."""
        cfg = self.cfg
        if cfg.variant == "uniform":
            if cfg.gates.uniform_value is not None:
                g = jnp.asarray(cfg.gates.uniform_value, jnp.float32)
            else:
                g = self.param("uniform_gate", nn.initializers.ones, ())
            return jnp.broadcast_to(g, (cfg.n_layers,))
        return self.param("layer_gate", nn.with_logical_partitioning(
            nn.initializers.ones, ("layers",)), (cfg.n_layers,))
