"""The KV cache and the core block, for a chunk of new tokens against what is cached.

A layer's cache is a dict of fixed-shape arrays (keys, values, each slot's position, the
slots filled); slots need not be positions (a MoD block's cache holds only the tokens that
entered), and attention masks by the stored positions. A chunk is one token or a whole
prompt; the modules carry the core's parameter names, so they take a trained model's own.
Depth: docs/decoding.md#the-cache-dynjaxdecodingcachepy
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from dynjax.models import moe
from dynjax.models.mod import EMPTY
from dynjax.models.transformer import (Mlp, ModelConfig, causal_attention, norm, out_projection,
                                       project_qkv)


def layer_cache(cfg: ModelConfig, batch: int, size: int) -> dict:
    """An empty cache of ``size`` slots for one attention layer."""
    k = jnp.zeros((batch, size, cfg.n_heads, cfg.head_dim), cfg.compute_dtype)
    return {"k": k, "v": jnp.zeros_like(k), "pos": jnp.full((batch, size), EMPTY, jnp.int32),
            "n": jnp.zeros((batch,), jnp.int32)}


def append_slots(cache, write):
    """(B, n) slot of each chunk token that ``write`` admits, in order after the ``n`` held;
    the others get slot S (out of range: ``mode="drop"`` writes nothing)."""
    S = cache["pos"].shape[1]
    slot = cache["n"][:, None] + jnp.cumsum(write, axis=1, dtype=jnp.int32) - 1
    return jnp.where(write, slot, S)


def write(cache, slot, k, v, pos, **more):
    """Store the chunk's keys, values and positions (B, n, ...) at ``slot`` (B, n), and
    ``more`` arrays (B, n, ...) in the cache's arrays of those names (an indexer's keys)."""
    S = cache["pos"].shape[1]
    rows = jnp.arange(slot.shape[0])[:, None]
    put = lambda buf, new: buf.at[rows, slot].set(new, mode="drop")
    return dict(cache, k=put(cache["k"], k), v=put(cache["v"], v), pos=put(cache["pos"], pos),
                n=cache["n"] + jnp.sum(slot < S, axis=1, dtype=jnp.int32),
                **{name: put(cache[name], a) for name, a in more.items()})


class CachedAttention(nn.Module):
    """``transformer.Attention``'s parameters for queries from ``xq`` and keys and values from
    ``xk``, ``xv`` (B, n, d) of the chunk plus the cache. Returns the output, the new cache
    and the attention logits (B, H, n, S) and log-sum-exp over the cache's slots. The rotary
    queries and keys are sown as "intermediates" (kept only when that collection is mutable:
    ``dynjax.decoding.predicted_skip`` carries them as the next block's KL reference)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, xq, xk, xv, pos, cache, slot):
        q, k, v = project_qkv(self.cfg, xq, xk, xv, pos, pos)
        self.sow("intermediates", "rotary_query", q)
        self.sow("intermediates", "rotary_key", k)
        cache = write(cache, slot, k, v, pos.index)
        out, lse, logits = causal_attention(q, cache["k"], cache["v"], pos.index, cache["pos"],
                                            row_stats=lambda _, logits, lse: logits)
        return out_projection(self.cfg)(out), cache, (logits, lse)


def moe_capacity(cfg: ModelConfig, max_len: int) -> int:
    """Expert buffer per sequence of an MoE layer decoded with a cache of max_len tokens:
    the sequence form's for a window of max_len (``moe.expert_capacity``)."""
    return moe.expert_capacity(cfg, max_len)


def moe_chunk(cfg: ModelConfig, x, counts, capacity, write_mask):
    """The MoE FFN of ``moe.py`` (a child named "moe": call inside a compact method) on a
    chunk (B, n, d): one token goes through
    ``MoeFfnPerToken`` (routes counted against ``counts``, each expert's routes so far); a
    longer chunk (prefill: ``counts`` must be zero) through the sequence ``MoeFfn`` with
    token-order buffers, which drops exactly the routes that token-by-token decoding would.
    Returns (y, counts, ffn_ran (B, n): some real expert took the token)."""
    if x.shape[1] == 1:
        y, new = moe.MoeFfnPerToken(cfg, name="moe")(x, counts, capacity, write_mask[:, 0])
        return y, new, (jnp.sum(new - counts, -1) > 0)[:, None]
    pcfg = cfg.replace(moe_priority="position")
    y, probs, _, stats = moe.MoeFfn(pcfg, name="moe")(x, None, write_mask, capacity)
    dispatch, _, _ = moe.token_choice(probs, cfg.moe.num_experts_per_tok, capacity,
                                      write_mask, by_position=True)
    routes = jnp.sum(dispatch[:, :, :cfg.moe.num_experts], axis=(1, 3)).astype(counts.dtype)
    return y, counts + routes, stats["ffn_ran"] & write_mask


class CachedBlock(nn.Module):
    """``transformer.Block``'s parameters and arithmetic (``moe_capacity`` set: an MoE FFN
    named "moe", as MoE layers and staged MoDE's block) for a chunk (B, n, d). Returns the
    update a + m, the new cache, and (attention logits, lse, ffn_ran)."""

    cfg: ModelConfig
    moe_capacity: int = 0

    @nn.compact
    def __call__(self, h, pos, cache, slot):
        cfg = self.cfg
        x = norm("attn_norm", cfg)(h)
        a, cache, (logits, lse) = CachedAttention(cfg, name="attn")(x, x, x, pos, cache, slot)
        x = norm("mlp_norm", cfg)(h + a)
        if not self.moe_capacity:
            return a + Mlp(cfg, name="mlp")(x), cache, (logits, lse, None)
        S = cache["pos"].shape[1]
        m, experts, ran = moe_chunk(cfg, x, cache["experts"], self.moe_capacity, slot < S)
        return a + m, dict(cache, experts=experts), (logits, lse, ran)


def layer_slices(cfg: ModelConfig, stacked, n: int):
    """The params of each of ``n`` layers built by ``transformer.scan_layers``: slices of the
    stacked arrays (scanned) or the ``layer_i`` entries (unrolled)."""
    if cfg.scan_layers:
        return [jax.tree.map(lambda a, i=i: a[i], stacked) for i in range(n)]
    return [stacked[f"layer_{i}"] for i in range(n)]
