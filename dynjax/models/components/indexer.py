"""The lightning indexer of DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5), per token.

Each query scores every earlier key with a few small relu heads and attends only to its
``index_topk`` best-scored visible keys. The scores are a coefficient site (layer, example,
token, key); replay recomputes the selection from the given scores, as MoD's top-k is.
Depth: docs/hf.md#the-lightning-indexer-dynjaxmodelscomponentsindexerpy
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dynjax.coeffs import Axes

F32 = jnp.float32
AXES = Axes(("layer", "example", "token", "key"))
LAYER_NORM_EPS = 1e-6


def rows(path, hidden: int, q_lora_rank: int, heads: int, head_dim: int):
    return [(path + ("q_b",), (q_lora_rank, heads, head_dim), (None, "heads", "kv")),
            (path + ("k",), (hidden, head_dim), ("embed", "kv")),
            (path + ("k_norm",), (head_dim,), ("kv",)),
            (path + ("k_norm_bias",), (head_dim,), ("kv",)),
            (path + ("weights",), (hidden, heads), ("embed", "heads"))]


def layer_norm(x, w, b, eps=LAYER_NORM_EPS):
    x32 = x.astype(F32)
    mu = jnp.mean(x32, -1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mu), -1, keepdims=True)
    return ((x32 - mu) * jax.lax.rsqrt(var + eps) * w + b).astype(x.dtype)


def rotate_first(x, cos, sin, interleave=False):
    """x (B, T, [H,] d) with its first 2 cos.shape[-1] channels rotated in half-split pairs
    (i, i + r/2), or with ``interleave`` in pairs (2i, 2i+1) gathered into halves first (as
    transformers does: queries and keys alike, so their dot products are unchanged);
    cos, sin (B, T, r/2)."""
    r = cos.shape[-1] * 2
    if x.ndim == 4:
        cos, sin = cos[:, :, None], sin[:, :, None]
    if interleave:
        x = jnp.concatenate([x[..., :r:2], x[..., 1:r:2], x[..., r:]], axis=-1)
    a, b, rest = x[..., :r // 2], x[..., r // 2:r], x[..., r:]
    return jnp.concatenate([a * cos - b * sin, b * cos + a * sin, rest], axis=-1)


def query(p, x, q_res, cos, sin, interleave=False):
    """The indexer's float32 queries (B, T, H, d) and head weights w (B, T, H)."""
    q = rotate_first(jnp.einsum("btr,rhd->bthd", q_res, p["q_b"]), cos, sin,
                     interleave).astype(F32)
    return q, (x @ p["weights"]).astype(F32) * F32(q.shape[-2] ** -0.5)


def keys(p, x, cos, sin, interleave=False):
    """The indexer's keys (B, T, d) in x's dtype, normed and rotated: what a decoding cache
    keeps per layer (``dynjax.decoding.llm``)."""
    return rotate_first(layer_norm(x @ p["k"], p["k_norm"], p["k_norm_bias"]), cos, sin,
                        interleave)


def score(q, w, k):
    """Scores (B, S, T) float32 of the queries and weights (:func:`query`) against keys k
    (B, T, d) (unmasked)."""
    d = q.shape[-1]
    s = jax.nn.relu(jnp.einsum("bshd,btd->bsht", q, k.astype(F32)) * F32(d ** -0.5))
    return jnp.einsum("bsht,bsh->bst", s, w)


def scores(p, x, q_res, cos, sin, interleave=False):
    """The indexer's scores (B, T, T) float32 of every query against every key (unmasked);
    ``interleave``: GLM-5's rotary pairs (DeepSeek-V3.2's are half-split)."""
    return score(*query(p, x, q_res, cos, sin, interleave), keys(p, x, cos, sin, interleave))


def select(scores, visible, topk: int):
    """(B, S, T) bool: each query's ``topk`` best visible keys (all of them when fewer)."""
    n = scores.shape[-1]
    k = min(topk, n)
    top = jax.lax.top_k(jnp.where(visible, scores, -jnp.inf), k)[1]
    return (jnp.sum(jax.nn.one_hot(top, n, dtype=jnp.int32), axis=-2) > 0) & visible


def attend_selected(q, k, v, chosen, scale):
    """Softmax attention of q (B, T, H, dk) over the keys ``chosen`` (B, T, T) marks for each
    query (already causal); out (B, T, H, dv)."""
    logits = jnp.einsum("bthd,bshd->bhts", q.astype(F32), k.astype(F32)) * F32(scale)
    probs = jax.nn.softmax(jnp.where(chosen[:, None], logits, -jnp.inf), axis=-1)
    return jnp.einsum("bhts,bshd->bthd", probs.astype(v.dtype), v)
