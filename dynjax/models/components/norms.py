"""RMSNorm as Hugging Face's decoder LLMs compute it."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def rms_norm(x, w, eps, axes=(-1,), offset=0.0):
    """HF's RMSNorm: statistics in float32, the normalised value cast back, then the scale.
    With ``offset`` (Qwen3-Next's and Gemma's zero-centred gain, 1 + w), the gain is
    ``offset + w`` and, as transformers computes those, applied in float32 before the cast.
    ``w`` None: no gain (Gemma-4's value and router norms)."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=axes, keepdims=True) + eps)
    if w is None:
        return y.astype(x.dtype)
    if offset:
        return (y * (offset + w.astype(jnp.float32))).astype(x.dtype)
    return w * y.astype(x.dtype)
