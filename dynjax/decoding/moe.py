"""KV-cache decoding of the MoE family (``dynjax.models.moe``: moe, mode_integrated).

Token choice only: each token goes to its top-k routes, and a route to an expert that has
already kept ``C`` routes in this sequence (the buffer for a window of ``max_len``) is
dropped, so decoding equals the sequence forward with ``moe_priority="position"``; where
capacity binds, a prefix's logits depend on max_len. Expert choice is refused.
Depth: docs/decoding.md#moe-and-integrated-mode-dynjaxdecodingmoepy
"""
from __future__ import annotations

import jax.numpy as jnp

from dynjax.decoding import protocol
from dynjax.decoding.cache import CachedBlock, append_slots, layer_cache, layer_slices
from dynjax.models import moe
from dynjax.models.transformer import ModelConfig


def forward_config(cfg: ModelConfig) -> ModelConfig:
    return cfg.replace(moe_priority="position")


def check(cfg: ModelConfig):
    if cfg.moe.routing != "token_choice":
        raise NotImplementedError(
            f"KV-cache decoding of {cfg.variant} needs token_choice routing: expert_choice "
            "ranks the whole sequence, which a causal decoder has not seen yet")


def init_cache(cfg: ModelConfig, batch: int, max_len: int):
    """Per layer: max_len slots and the routes each expert has kept (B, E)."""
    check(cfg)
    return [dict(layer_cache(cfg, batch, max_len),
                 experts=jnp.zeros((batch, cfg.moe.num_experts), jnp.int32))
            for _ in range(cfg.n_layers)]


def layers(cfg: ModelConfig, params, cache, h, pos, branch):
    """info: ``ffn_ran`` (layers, B, n), whether some real expert took the token."""
    del branch
    check(cfg)
    capacity = moe.expert_capacity(cfg, cache[0]["pos"].shape[1])
    new_cache, ran = [], []
    for p, c in zip(layer_slices(cfg, params["layers"], cfg.n_layers), cache):
        update, c, (_, _, r) = CachedBlock(cfg, capacity).apply(
            {"params": p}, h, pos, c, append_slots(c, jnp.ones(h.shape[:2], bool)))
        h = h + update
        new_cache.append(c)
        ran.append(r)
    return h, new_cache, {"ffn_ran": jnp.stack(ran)}


def chunk(cfg: ModelConfig, params, cache, tokens, pos, branch):
    """tokens (B, n) at ``pos`` -> logits, the new cache, info (``protocol.core_chunk``)."""
    return protocol.core_chunk(layers, cfg, params, cache, tokens, pos, branch)


positions = protocol.core_positions
