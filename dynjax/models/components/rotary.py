"""Rotary position embeddings, as transformers' rope functions compute them.

``Config.rope_type`` picks the inverse frequencies ("default", "linear", "llama3", "yarn",
"proportional"); orthogonal to it, ``partial_rotary_factor`` rotates only the first
fraction of each head and ``rope_interleave`` takes the rotated pairs as (2i, 2i+1).
Depth: docs/hf.md#rotary-embeddings-dynjaxmodelscomponentsrotarypy
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from dynjax.models.transformer import Positions, rotary as rotate_half_form

F32 = jnp.float32
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional")


def rope_dim(cfg) -> int:
    """How many leading channels of a head rotate (``head_dim`` x partial_rotary_factor;
    "proportional": every channel, some at frequency 0)."""
    if cfg.rope_type == "proportional":
        return cfg.head_dim
    return int(cfg.head_dim * cfg.partial_rotary_factor)


def _yarn(cfg, inv: np.ndarray, dim: int) -> np.ndarray:
    base, f = cfg.rope_theta, cfg.rope_factor

    def correction_dim(rotations):   # the channel whose wavelength fits `rotations` turns
        return dim * math.log(cfg.rope_original_max_position / (rotations * 2 * math.pi)) / (
            2 * math.log(base))
    low, high = correction_dim(cfg.rope_beta_fast), correction_dim(cfg.rope_beta_slow)
    if cfg.rope_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolate = (1 - ramp).astype(np.float32)
    interpolated = (1.0 / (np.float32(f) * (np.float32(base) ** (
        np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))))).astype(np.float32)
    return (interpolated * (1 - extrapolate) + inv * extrapolate).astype(np.float32)


def inv_frequencies(cfg) -> np.ndarray:
    """Rotary inverse frequencies (rope_dim / 2,) float32, as HF's rope init computes them.
    "proportional" (Gemma-4's full layers): the whole head in rotate-half pairs (i, i + d/2),
    the first d/2 x partial_rotary_factor at theta^(-2i/d) (the denominator the whole head
    width, unlike "default"), the others at frequency 0, so they pass unrotated."""
    dim = rope_dim(cfg)
    if cfg.rope_type == "proportional":
        turning = int(cfg.partial_rotary_factor * dim // 2)
        inv = 1.0 / (np.float32(cfg.rope_theta) ** (
            np.arange(0, 2 * turning, 2, dtype=np.float32) / np.float32(dim)))
        inv = np.concatenate([inv.astype(np.float32), np.zeros(dim // 2 - turning, np.float32)])
        return (inv / np.float32(cfg.rope_factor)).astype(np.float32)
    inv = 1.0 / (np.float32(cfg.rope_theta) ** (
        np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    inv = inv.astype(np.float32)
    if cfg.rope_type == "linear":
        return (inv / np.float32(cfg.rope_factor)).astype(np.float32)
    if cfg.rope_type == "llama3":
        f, lo, hi = cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        old = cfg.rope_original_max_position
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / lo, inv / f, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / f + smooth * scaled
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    if cfg.rope_type == "yarn":
        return _yarn(cfg, inv, dim)
    return inv


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction 0.1 mscale ln(factor) + 1 (1 when not stretched)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def attention_factor(cfg) -> float:
    """The factor YaRN multiplies cos and sin by (1 for the other rope types)."""
    if cfg.rope_type != "yarn":
        return 1.0
    if cfg.rope_attention_factor:   # 0: derived from the factor and mscales
        return float(cfg.rope_attention_factor)
    if cfg.rope_mscale and cfg.rope_mscale_all_dim:
        return float(yarn_mscale(cfg.rope_factor, cfg.rope_mscale)
                     / yarn_mscale(cfg.rope_factor, cfg.rope_mscale_all_dim))
    return yarn_mscale(cfg.rope_factor)


def positions_at(cfg, index) -> Positions:
    """The core's :class:`Positions` of tokens at integer positions ``index`` (B, T)."""
    angle = index.astype(F32)[..., None] * jnp.asarray(inv_frequencies(cfg))
    scale = attention_factor(cfg)
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    if scale != 1.0:
        cos, sin = cos * F32(scale), sin * F32(scale)
    return Positions(index.astype(jnp.int32), cos, sin)


def apply(cfg, x, positions: Positions):
    """x (B, T, H, d) with its first ``rope_dim`` channels rotated (in pairs (i, i + r/2),
    or (2i, 2i+1) gathered into halves when ``rope_interleave``)."""
    r = positions.cos.shape[-1] * 2
    rot, rest = x[..., :r], x[..., r:]
    if cfg.rope_interleave:
        rot = jnp.concatenate([rot[..., 0::2], rot[..., 1::2]], axis=-1)
    rot = rotate_half_form(rot, positions)
    return rot if rest.shape[-1] == 0 else jnp.concatenate([rot, rest], axis=-1)
