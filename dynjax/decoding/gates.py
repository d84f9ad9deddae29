"""KV-cache decoding of the residual-gate family (``dynjax.models.gates``).

Each layer runs its block on the chunk against its cache and adds ``g * F`` with the gate
the full forward would give the same token; FeatureGate's features come from the block's
attention over the cache's slots and the previous layer's distribution for the same token,
carried from layer to layer inside the step as the sequence form carries it.
Depth: docs/decoding.md#residual-gates-dynjaxdecodinggatespy
"""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from dynjax.decoding import protocol
from dynjax.decoding.cache import CachedBlock, append_slots, layer_cache, layer_slices
from dynjax.models import gates
from dynjax.models.transformer import MASK_VALUE, ModelConfig


def n_blocks(cfg: ModelConfig) -> int:
    return cfg.gates.fixed_depth if cfg.variant == "fixed_depth" else cfg.n_layers


def init_cache(cfg: ModelConfig, batch: int, max_len: int):
    return [layer_cache(cfg, batch, max_len) for _ in range(n_blocks(cfg))]


def uniform_logp(pos, cache_pos, n_heads):
    """Layer 0's KL reference: log of the uniform distribution over each query's visible
    keys (B, H, n, S), as ``GatedDecoder`` builds it for a full window."""
    visible = cache_pos[:, None, :] <= pos[:, :, None]                     # (B, n, S)
    count = jnp.sum(visible, axis=-1, keepdims=True).astype(jnp.float32)
    logp = jnp.where(visible, -jnp.log(count), MASK_VALUE)
    return jnp.broadcast_to(logp[:, None], (pos.shape[0], n_heads) + visible.shape[1:])


class CachedGateLayer(nn.Module):
    """``gates.GateLayer``'s parameters ("block", "controller") for a chunk against a cache.
    ``gate``: the static gate of this layer, or None (dense: 1; feature_gate: controller).
    ``prev_logp``: the previous layer's attention log-probabilities, None in layer 0."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, h, pos, cache, prev_logp, gate):
        cfg = self.cfg
        update, cache, (logits, lse, _) = CachedBlock(cfg, name="block")(
            h, pos, cache, append_slots(cache, jnp.ones(h.shape[:2], bool)))
        if cfg.variant in ("dense", "fixed_depth"):
            return h + update, cache, prev_logp, jnp.ones(h.shape[:2], jnp.float32)
        if cfg.variant == "feature_gate":
            if prev_logp is None:
                prev_logp = uniform_logp(pos.index, cache["pos"], cfg.n_heads)
            per_head = gates.row_features(logits, lse, prev_logp)
            prev_logp = logits - lse[..., None]
            g = gates.Controller(cfg, name="controller")(
                gates.attention_features(per_head, update, h))
        else:
            g = jnp.broadcast_to(gate, h.shape[:2]).astype(jnp.float32)
        return h + g[..., None].astype(h.dtype) * update, cache, prev_logp, g


def static_gates(cfg: ModelConfig, params):
    """(layers,) gates of uniform and layer_static: the parameters (or the fixed value) that
    ``GatedDecoder.static_gate`` reads."""
    if cfg.variant == "layer_static":
        return params["layer_gate"]
    g = params["uniform_gate"] if cfg.gates.uniform_value is None else cfg.gates.uniform_value
    return jnp.broadcast_to(jnp.asarray(g, jnp.float32), (cfg.n_layers,))


def layers(cfg: ModelConfig, params, cache, h, pos, branch):
    """Every block on the chunk h (B, n, d). info: ``gate`` (layers, B, n), the gate each
    block's update was multiplied by (1 where there is none)."""
    del branch  # every block runs for every token
    static = static_gates(cfg, params) if cfg.variant in ("uniform", "layer_static") else None
    prev_logp = None  # layer 0: the uniform reference over the keys it sees
    new_cache, used = [], []
    for i, (p, c) in enumerate(zip(layer_slices(cfg, params["layers"], n_blocks(cfg)), cache)):
        h, c, prev_logp, g = CachedGateLayer(cfg).apply(
            {"params": p}, h, pos, c, prev_logp, None if static is None else static[i])
        new_cache.append(c)
        used.append(g)
    return h, new_cache, {"gate": jnp.stack(used)}


def chunk(cfg: ModelConfig, params, cache, tokens, pos, branch):
    """tokens (B, n) at ``pos`` -> logits, the new cache, info (``protocol.core_chunk``)."""
    return protocol.core_chunk(layers, cfg, params, cache, tokens, pos, branch)


positions = protocol.core_positions
forward_config = protocol.same_config
