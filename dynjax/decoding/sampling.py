"""Choosing the next token from logits: greedy, or sampled with temperature, top-k, top-p.

One pure function so that ``generate`` keeps static shapes under ``lax.scan`` whatever the
options: top-k and top-p are masks over the sorted vocabulary, never data-dependent slices.
Greedy (``temperature == 0``) ignores the key and is ``argmax``, so it equals the greedy
decoder that came before sampling existed.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Sampling:
    """``temperature`` 0 is greedy; ``top_k`` 0 keeps every token; ``top_p`` 1 keeps every
    token (nucleus: the smallest set of most likely tokens whose probability reaches p)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 is greedy)")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 keeps every token)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1] (1 keeps every token)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filtered_logits(logits, top_k: int = 0, top_p: float = 1.0):
    """``logits`` (..., V) with every token outside the top-k / nucleus set to -inf. The most
    likely token always stays, so the distribution is never empty."""
    order = jnp.argsort(-logits, axis=-1)
    ranked = jnp.take_along_axis(logits, order, -1)
    keep = jnp.ones(ranked.shape, bool)
    if top_k:
        keep &= jnp.arange(ranked.shape[-1]) < top_k
    if top_p < 1:
        probs = jax.nn.softmax(ranked, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs     # mass of the more likely tokens
        keep &= before < top_p
    keep = keep.at[..., 0].set(True)
    kept_ranked = jnp.where(keep, ranked, -jnp.inf)
    inverse = jnp.argsort(order, axis=-1)
    return jnp.take_along_axis(kept_ranked, inverse, -1)


def next_token(logits, key, sampling: Sampling):
    """logits (B, V) -> tokens (B,) int32."""
    if sampling.greedy:
        return jnp.argmax(logits, -1).astype(jnp.int32)
    scaled = logits.astype(jnp.float32) / sampling.temperature
    return jax.random.categorical(
        key, filtered_logits(scaled, sampling.top_k, sampling.top_p), axis=-1).astype(jnp.int32)
