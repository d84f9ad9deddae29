"""What every family's decoder module provides (``FamilyDecoder``), and the defaults the
core-transformer families (gates, MoD, MoE, MUDD) share: the core's embedding, rotary
positions and head around the family's own ``layers``."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from dynjax.models.transformer import Embed, Head, Positions, token_positions


@runtime_checkable
class FamilyDecoder(Protocol):
    """A family's KV-cache decoder: ``dynjax.decoding.FAMILIES`` holds one per family that
    decodes; ``dynjax.decoding.REFUSED`` names the others and why."""

    def forward_config(self, cfg):
        """The config whose sequence forward decoding reproduces."""

    def init_cache(self, cfg, batch: int, max_len: int):
        """An empty cache: one dict of fixed-shape arrays per layer."""

    def positions(self, cfg, index, bound=None) -> Positions:
        """Rotary positions of tokens at integer positions ``index`` (B, n)."""

    def chunk(self, cfg, params, cache, tokens, positions: Positions, branch: str):
        """tokens (B, n) -> (logits (B, n, V), the new cache, info (leaves (layers, B, n)))."""


def same_config(cfg):
    """Decoding reproduces the model's own forward."""
    return cfg


def core_positions(cfg, index, bound=None) -> Positions:
    return token_positions(cfg, index, bound)


def core_chunk(layers, cfg, params, cache, tokens, positions: Positions, branch: str):
    """The core's embedding, the family's ``layers`` against the cache, the core's head."""
    h = Embed(cfg).apply({"params": params["embed"]}, tokens)
    h, cache, info = layers(cfg, params, cache, h, positions, branch)
    return Head(cfg).apply({"params": params["head"]}, h), cache, info
