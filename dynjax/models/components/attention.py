"""Token mixers of the ``llm`` family (``Config.attention``), each a namespace of:

- ``rows(cfg, prefix)``: its parameters as (path, shape, logical axes) rows;
- ``project(cfg, p, x, positions)``: queries (B, T, H, dq) and the keys and values
  (B, T, KV, dk / dv) a KV cache holds, rotary applied;
- ``attend(cfg, p, q, k, v, q_pos, k_pos)``: causal attention of q over k, v and the
  output projection, (B, Tq, D);
- ``cache_shape(cfg)``: ((KV, dk), (KV, dv)), the per-token key and value a cache keeps.

"gqa": grouped-query attention (Llama, Qwen, Mixtral, OLMoE, Mistral): each key/value head
serves n_heads / n_kv_heads consecutive query heads; optional q/k/v and output biases, q/k
RMSNorm per head (Qwen3) or over all heads (OLMoE), OLMoE's clip.
"""
from __future__ import annotations

import jax.numpy as jnp

from dynjax.models.components import norms, rotary
from dynjax.models.transformer import Positions, causal_attention


class Gqa:
    """Grouped-query attention with the optional biases, q/k norms and clip above."""

    @staticmethod
    def rows(cfg, A):
        D, H, KV, hd = cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        rows = []
        for name, heads in (("q", H), ("k", KV), ("v", KV)):
            rows.append((A + (name,), (D, heads, hd), ("embed", "heads", "kv")))
            if cfg.qkv_bias:
                rows.append((A + (name + "_bias",), (heads, hd), ("heads", "kv")))
        rows.append((A + ("o",), (H, hd, D), ("heads", "kv", "embed")))
        if cfg.o_bias:
            rows.append((A + ("o_bias",), (D,), ("embed",)))
        if cfg.qk_norm == "head":
            rows += [(A + ("q_norm",), (hd,), ("kv",)), (A + ("k_norm",), (hd,), ("kv",))]
        elif cfg.qk_norm == "full":
            rows += [(A + ("q_norm",), (H, hd), ("heads", "kv")),
                     (A + ("k_norm",), (KV, hd), ("heads", "kv"))]
        return rows

    @staticmethod
    def project(cfg, p, x, positions: Positions):
        """Rotary queries (B, T, H, hd), keys and values (B, T, KV, hd) of x (B, T, D)."""
        dt = cfg.compute_dtype

        def proj(name):
            y = jnp.einsum("btd,dhk->bthk", x, p[name].astype(dt))
            return y + p[name + "_bias"].astype(dt) if cfg.qkv_bias else y
        q, k, v = proj("q"), proj("k"), proj("v")
        eps = cfg.rms_norm_eps
        if cfg.qk_norm == "head":
            q, k = norms.rms_norm(q, p["q_norm"], eps), norms.rms_norm(k, p["k_norm"], eps)
        elif cfg.qk_norm == "full":
            q = norms.rms_norm(q, p["q_norm"], eps, axes=(-2, -1))
            k = norms.rms_norm(k, p["k_norm"], eps, axes=(-2, -1))
        if cfg.clip_qkv is not None:
            q, k, v = (jnp.clip(a, -cfg.clip_qkv, cfg.clip_qkv) for a in (q, k, v))
        return rotary.apply(cfg, q, positions), rotary.apply(cfg, k, positions), v

    @staticmethod
    def attend(cfg, p, q, k, v, q_pos, k_pos):
        """GQA softmax attention of q against k, v, then the output projection: (B, Tq, D)."""
        group = cfg.n_heads // cfg.n_kv_heads
        k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
        block = cfg.attn_block if q.shape[1] == k.shape[1] else 0
        out, _, _ = causal_attention(q, k, v, q_pos, k_pos, block)
        y = jnp.einsum("bthk,hkd->btd", out, p["o"].astype(cfg.compute_dtype))
        return y + p["o_bias"].astype(y.dtype) if cfg.o_bias else y

    @staticmethod
    def cache_shape(cfg):
        return (cfg.n_kv_heads, cfg.head_dim), (cfg.n_kv_heads, cfg.head_dim)


ATTENTION = {"gqa": Gqa}
