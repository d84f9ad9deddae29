"""KV-cache decoding of the MUDD family (``dynjax.models.mudd``: mudd, mudd_static).

The mixes are per token: block i's four input streams for a token are mixes of that
token's own sources X_0 .. X_i, so only each block's keys and values of earlier tokens need
caching (computed, as in the sequence form, from the normalised key and value streams).
"""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from dynjax.decoding import protocol
from dynjax.decoding.cache import CachedAttention, append_slots, layer_cache
from dynjax.models import mudd
from dynjax.models.muddpythia import mix
from dynjax.models.transformer import Mlp, ModelConfig, norm


def init_cache(cfg: ModelConfig, batch: int, max_len: int):
    return [layer_cache(cfg, batch, max_len) for _ in range(cfg.n_layers)]


class CachedMuddBlock(nn.Module):
    """``mudd.MuddBlock``'s parameters and arithmetic for a chunk against a cache."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, streams, pos, cache, slot):
        cfg = self.cfg
        xq, xk, xv, xr = streams
        a, cache, _ = CachedAttention(cfg, name="attn")(
            norm("q_norm", cfg)(xq), norm("k_norm", cfg)(xk), norm("v_norm", cfg)(xv), pos,
            cache, slot)
        h = xr + a
        return h + Mlp(cfg, name="mlp")(norm("mlp_norm", cfg)(h)), cache


class CachedMuddLayer(nn.Module):
    """``mudd.MuddLayer``'s parameters: the block, then the coefficients that mix the
    token's sources into the next streams (the DA MLP plus the static bias, or the bias)."""

    cfg: ModelConfig
    index: int

    @nn.compact
    def __call__(self, streams, sources, pos, cache):
        cfg = self.cfg
        C, S = mudd.n_streams(cfg, self.index), self.index + 2
        x, cache = CachedMuddBlock(cfg, name="block")(
            streams, pos, cache, append_slots(cache, jnp.ones(streams[0].shape[:2], bool)))
        bias = self.param("static_bias", nn.initializers.zeros, (C, S))
        if cfg.variant == "mudd":
            coef = mudd.DynamicDense(cfg, C, S, name="da")(norm("da_norm", cfg)(x))
            coef = coef + bias[:, None, None, :]
        else:
            coef = jnp.broadcast_to(bias[:, None, None, :], (C,) + x.shape[:2] + (S,))
        sources = sources + [x]
        return tuple(mix(coef.astype(jnp.float32), sources, cfg.compute_dtype)), sources, cache


def layers(cfg: ModelConfig, params, cache, h, pos, branch):
    del branch
    streams, sources, new_cache = (h,) * 4, [h], []
    for i, c in enumerate(cache):
        streams, sources, c = CachedMuddLayer(cfg, i).apply(
            {"params": params[f"layer_{i}"]}, streams, sources, pos, c)
        new_cache.append(c)
    return streams[0], new_cache, {}


def chunk(cfg: ModelConfig, params, cache, tokens, pos, branch):
    """tokens (B, n) at ``pos`` -> logits, the new cache, info (``protocol.core_chunk``)."""
    return protocol.core_chunk(layers, cfg, params, cache, tokens, pos, branch)


positions = protocol.core_positions
forward_config = protocol.same_config
