"""Token mixers of the ``llm`` family (``Config.attention``), each a namespace of ``rows``,
``project`` (queries and the keys and values a KV cache holds, rotary applied), ``attend``
(causal attention, an optional per-head gate, the output projection) and ``cache_shape``.

"gqa": grouped-query attention (Llama, Qwen, Mixtral, OLMoE, Mistral; Gemma-4's switches);
"mla": DeepSeek's multi-head latent attention (DeepSeek-V2/V3, Kimi-K2, Moonlight);
"gqa_sinks" (gpt-oss): "gqa" plus a learned sink logit per head and a sliding window.
Depth: docs/hf.md#token-mixers-dynjaxmodelscomponentsattentionpy
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dynjax.models import matmul
from dynjax.models.components import norms, rotary
from dynjax.models.transformer import MASK_VALUE, Positions, attention_scores, causal_attention


class Gqa:
    """Grouped-query attention with the optional biases, q/k norms and clip above, and
    Gemma-4's switches: ``v_norm`` (a gain-less RMSNorm of each value head), ``k_eq_v`` (no
    value projection: the values are the key projection before its norm and rotary),
    ``attention_scale`` (the logits' factor; 0: head_dim^-1/2) and, where the layer has one
    (``llm.layer_config``), a causal ``sliding_window`` as "gqa_sinks"'s (docs/hf.md)."""

    @staticmethod
    def rows(cfg, A):
        D, H, KV, hd = cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        rows = []
        for name, heads in (("q", H), ("k", KV)) + ((("v", KV),) if not cfg.k_eq_v else ()):
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
            y = matmul.einsum("btd,dhk->bthk", x, p[name].astype(dt))
            return y + p[name + "_bias"].astype(dt) if cfg.qkv_bias else y
        q, k = proj("q"), proj("k")
        v = k if cfg.k_eq_v else proj("v")
        eps = cfg.rms_norm_eps
        if cfg.v_norm:
            v = norms.rms_norm(v, None, eps)
        off = cfg.norm_offset
        if cfg.qk_norm == "head":
            q, k = (norms.rms_norm(q, p["q_norm"], eps, offset=off),
                    norms.rms_norm(k, p["k_norm"], eps, offset=off))
        elif cfg.qk_norm == "full":
            q = norms.rms_norm(q, p["q_norm"], eps, axes=(-2, -1), offset=off)
            k = norms.rms_norm(k, p["k_norm"], eps, axes=(-2, -1), offset=off)
        if cfg.clip_qkv is not None:
            q, k, v = (jnp.clip(a, -cfg.clip_qkv, cfg.clip_qkv) for a in (q, k, v))
        return rotary.apply(cfg, q, positions), rotary.apply(cfg, k, positions), v

    @staticmethod
    def attend(cfg, p, q, k, v, q_pos, k_pos, gate=None):
        """GQA softmax attention of q against k, v, times ``gate`` (B, Tq, H, hd) where
        given (Qwen3-Next's output gate), then the output projection: (B, Tq, D)."""
        k, v = Gqa.share(cfg, k, v)
        block = cfg.attn_block if q.shape[1] == k.shape[1] else 0
        scale = cfg.attention_scale or None
        if cfg.sliding_window:
            out = sink_attention(q, k, v, q_pos, k_pos, None, cfg.sliding_window, block, scale)
        else:
            out, _, _ = causal_attention(q, k, v, q_pos, k_pos, block, scale=scale)
        return Gqa.output(cfg, p, Gqa.gated(out, gate))

    @staticmethod
    def gated(out, gate):
        """Each head's output (B, T, H, hd) times the output gate, where there is one."""
        return out if gate is None else out * gate.astype(out.dtype)

    @staticmethod
    def share(cfg, k, v):
        """Each key/value head repeated for its n_heads / n_kv_heads query heads."""
        group = cfg.n_heads // cfg.n_kv_heads
        k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
        return k, v

    @staticmethod
    def output(cfg, p, out):
        """The output projection (and bias) of the heads' outputs (B, T, H, hd)."""
        y = jnp.einsum("bthk,hkd->btd", out, p["o"].astype(cfg.compute_dtype))
        return y + p["o_bias"].astype(y.dtype) if cfg.o_bias else y

    @staticmethod
    def cache_shape(cfg):
        return (cfg.n_kv_heads, cfg.head_dim), (cfg.n_kv_heads, cfg.head_dim)


# transformers' MLA modules (DeepSeek-V2/V3/V3.2, GLM-4.7-Flash, GLM-5) build their q and kv
# latent RMSNorms with the constructor's default eps, whatever config.json's rms_norm_eps
LATENT_NORM_EPS = 1e-6


class Mla:
    """Multi-head latent attention (the docstring above)."""

    @staticmethod
    def rows(cfg, A):
        D, H, r = cfg.hidden_size, cfg.n_heads, cfg.head_dim
        qk = cfg.qk_nope_head_dim + r
        rows = []
        if cfg.q_lora_rank:
            rows += [(A + ("q_a",), (D, cfg.q_lora_rank), ("embed", None)),
                     (A + ("q_a_norm",), (cfg.q_lora_rank,), (None,)),
                     (A + ("q_b",), (cfg.q_lora_rank, H, qk), (None, "heads", "kv"))]
        else:
            rows.append((A + ("q",), (D, H, qk), ("embed", "heads", "kv")))
        return rows + [
            (A + ("kv_a",), (D, cfg.kv_lora_rank + r), ("embed", None)),
            (A + ("kv_a_norm",), (cfg.kv_lora_rank,), (None,)),
            (A + ("kv_b",), (cfg.kv_lora_rank, H, cfg.qk_nope_head_dim + cfg.v_head_dim),
             (None, "heads", "kv")),
            (A + ("o",), (H, cfg.v_head_dim, D), ("heads", "kv", "embed"))]

    @staticmethod
    def project(cfg, p, x, positions: Positions):
        """Queries and keys (B, T, H, qk_nope + qk_rope), values (B, T, H, v_head_dim)."""
        dt, eps, nope = cfg.compute_dtype, LATENT_NORM_EPS, cfg.qk_nope_head_dim
        w = lambda name: p[name].astype(dt)
        if cfg.q_lora_rank:
            q = matmul.einsum("btr,rhk->bthk", norms.rms_norm(
                matmul.mm(x, w("q_a")), p["q_a_norm"], eps), w("q_b"))
        else:
            q = matmul.einsum("btd,dhk->bthk", x, w("q"))
        q = jnp.concatenate([q[..., :nope], rotary.apply(cfg, q[..., nope:], positions)], -1)
        latent = matmul.mm(x, w("kv_a"))
        kv = matmul.einsum("btr,rhk->bthk", norms.rms_norm(
            latent[..., :cfg.kv_lora_rank], p["kv_a_norm"], eps), w("kv_b"))
        k_rope = rotary.apply(cfg, latent[..., None, cfg.kv_lora_rank:], positions)
        k = jnp.concatenate([kv[..., :nope], jnp.broadcast_to(
            k_rope, (*kv.shape[:-1], k_rope.shape[-1]))], -1)
        return q, k, kv[..., nope:]

    @staticmethod
    def scale(cfg) -> float:
        s = (cfg.qk_nope_head_dim + cfg.head_dim) ** -0.5
        if cfg.rope_type != "default" and cfg.rope_mscale_all_dim:
            s *= rotary.yarn_mscale(cfg.rope_factor, cfg.rope_mscale_all_dim) ** 2
        return s

    @staticmethod
    def attend(cfg, p, q, k, v, q_pos, k_pos, gate=None):
        block = cfg.attn_block if q.shape[1] == k.shape[1] else 0
        out, _, _ = causal_attention(q, k, v, q_pos, k_pos, block, scale=Mla.scale(cfg))
        out = Gqa.gated(out, gate)
        return matmul.einsum("bthk,hkd->btd", out, p["o"].astype(cfg.compute_dtype))

    @staticmethod
    def cache_shape(cfg):
        return ((cfg.n_heads, cfg.qk_nope_head_dim + cfg.head_dim),
                (cfg.n_heads, cfg.v_head_dim))


def sink_softmax(logits, sinks):
    """Attention probabilities (B, H, Tq, Tk) of masked ``logits`` with one learned sink
    logit per head (``sinks`` (H,)) joining each row's softmax, its probability dropped:
    gpt-oss's and DeepSeek-V4's attention sinks."""
    sink = jnp.broadcast_to(sinks.astype(logits.dtype)[None, :, None, None],
                            logits.shape[:-1] + (1,))
    return jax.nn.softmax(jnp.concatenate([logits, sink], axis=-1), axis=-1)[..., :-1]


def _sink_attend(q, k, v, q_pos, k_pos, sinks, window: int, scale=None):
    logits = attention_scores(q, k, scale)                          # (B, H, Tq, Tk) float32
    gap = q_pos[:, :, None] - k_pos[:, None, :]
    visible = gap >= 0
    if window:
        visible &= gap < window
    logits = jnp.where(visible[:, None], logits, MASK_VALUE)
    probs = jax.nn.softmax(logits, axis=-1) if sinks is None else sink_softmax(logits, sinks)
    return matmul.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v)


def sink_attention(q, k, v, q_pos, k_pos, sinks, window: int = 0, block: int = 0,
                   scale=None):
    """Softmax attention over [the visible keys, one sink logit per head], the sink's
    probability dropped: out (B, Tq, H, hd) of q, k, v (B, T, H, hd), sinks (H,) (None: no
    sink, plain windowed attention); ``scale``: the logits' factor (default hd^-1/2).

    ``window`` > 0 also hides keys ``window`` or more positions back. ``block`` > 0
    (self-attention in causal order, as ``transformer.causal_attention``): each block of
    queries attends over the keys from the window's start to the block's end only."""
    T = q.shape[1]
    if block <= 0 or T != k.shape[1] or T <= block:
        return _sink_attend(q, k, v, q_pos, k_pos, sinks, window, scale)
    parts = []
    for i in range(0, T, block):
        lo = max(0, i - window + 1) if window else 0
        parts.append(_sink_attend(q[:, i:i + block], k[:, lo:i + block], v[:, lo:i + block],
                                  q_pos[:, i:i + block], k_pos[:, lo:i + block], sinks, window,
                                  scale))
    return jnp.concatenate(parts, axis=1)


class GqaSinks(Gqa):
    """"gqa" with attention sinks and the layer's sliding window (gpt-oss)."""

    @staticmethod
    def rows(cfg, A):
        return Gqa.rows(cfg, A) + [(A + ("sinks",), (cfg.n_heads,), ("heads",))]

    @staticmethod
    def attend(cfg, p, q, k, v, q_pos, k_pos, gate=None):
        k, v = Gqa.share(cfg, k, v)
        block = cfg.attn_block if q.shape[1] == k.shape[1] else 0
        out = sink_attention(q, k, v, q_pos, k_pos, p["sinks"], cfg.sliding_window, block)
        return Gqa.output(cfg, p, Gqa.gated(out, gate))


ATTENTION = {"gqa": Gqa, "mla": Mla, "gqa_sinks": GqaSinks}
