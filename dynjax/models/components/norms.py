"""RMSNorm as Hugging Face's decoder LLMs compute it."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def rms_norm(x, w, eps, axes=(-1,)):
    """HF's RMSNorm: statistics in float32, the normalised value cast back, then the scale."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=axes, keepdims=True) + eps)
    return w * y.astype(x.dtype)
