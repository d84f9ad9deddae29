"""KV-cache decoding of DeepSeek-V4 (``dynjax.models.deepseek_v4``). Per layer: the last
``sliding_window - 1`` keys (= values) in a ring; per compressor (HCA; CSA's and its lightning
indexer's), the open window's projections and gates, the entries of the closed windows and,
for CSA's overlapping windows, the last closed window's first series. mHC keeps nothing: its
streams are per token. A chunk (a prompt, or one token a step, at consecutive positions after
the cached ones) runs the model's own ``run`` with this attention in place of the sequence
one, so decoding equals the forward within float tolerance (docs/hf.md, DeepSeek-V4).
"""
from __future__ import annotations

import jax.numpy as jnp

from dynjax.decoding import protocol
from dynjax.models import deepseek_v4 as v4
from dynjax.models.mod import EMPTY

COMPRESSED = {"heavily_compressed_attention": ("hca_rate", False),
              "compressed_sparse_attention": ("csa_rate", True)}


def _compressor(cfg: v4.Config, batch: int, max_len: int, rate: int, dim: int, overlap: bool):
    width = 2 * dim if overlap else dim
    dt = jnp.dtype(cfg.dtype)
    state = {"kv": jnp.zeros((batch, rate, width), dt), "gate": jnp.zeros((batch, rate, width), dt),
             "entries": jnp.zeros((batch, max_len // rate, dim), dt)}
    if overlap:
        state["prev_kv"] = jnp.zeros((batch, rate, dim), dt)
        state["prev_gate"] = jnp.full((batch, rate, dim), -jnp.inf, dt)
    return state


def init_cache(cfg: v4.Config, batch: int, max_len: int):
    """Per layer: the window ring and, for compressed layers, each compressor's state."""
    ring = max(cfg.sliding_window - 1, 1)
    out = []
    for kind in cfg.layer_types:
        c = {"win": jnp.zeros((batch, ring, cfg.head_dim), jnp.dtype(cfg.dtype)),
             "win_pos": jnp.full((batch, ring), EMPTY, jnp.int32)}
        if kind in COMPRESSED:
            rate_name, overlap = COMPRESSED[kind]
            rate = getattr(cfg, rate_name)
            c["compressor"] = _compressor(cfg, batch, max_len, rate, cfg.head_dim, overlap)
            if overlap:
                c["indexer"] = _compressor(cfg, batch, max_len, rate, cfg.index_head_dim, True)
        out.append(c)
    return out


def positions(cfg, index, bound=None):
    """Integer positions (B, n): V4's rotary angles are taken per layer kind."""
    del cfg, bound
    return index


forward_config = protocol.same_config


def _take(a, index):
    """a (B, S, d) at slots ``index`` (B, ..): (B, .., d)."""
    flat = index.reshape(index.shape[0], -1)
    got = jnp.take_along_axis(a, flat[..., None], axis=1)
    return got.reshape(*index.shape, a.shape[-1])


def compress(cfg: v4.Config, p, state, x, pos, rate: int, dim: int, overlap: bool):
    """The compressor's state after the chunk x (B, n, D) at positions ``pos`` (B, n):
    every window closing in the chunk (at most n // rate + 1 candidates) pooled from the
    open window's saved slots and the chunk's tokens and written at its index; the window
    left open (and CSA's last closed first series) saved for the next chunk."""
    B, n, _ = x.shape
    kv = x @ p["kv"]
    gate = x @ p["gate"] + p["position_bias"][pos % rate]
    start = pos[:, :1]                                    # (B, 1) the chunk's first position
    cur_kv, cur_gate = (jnp.concatenate([state[k], a], 1) for k, a in (("kv", kv), ("gate", gate)))

    def cur(q):   # positions (B, m, rate) of the open window or the chunk -> (kv, gate)
        s = start[..., None]
        i = jnp.clip(jnp.where(q >= s, rate + q - s, q % rate), 0, rate + n - 1)
        return _take(cur_kv, i), _take(cur_gate, i)

    def prev(q):  # positions of the window before: first series from the saved ones or the chunk
        s = start[..., None]
        i = jnp.where(q >= s, 2 * rate + q - s,
                      jnp.where(q >= s // rate * rate, rate + q % rate, q % rate))
        i = jnp.clip(i, 0, 2 * rate + n - 1)
        src = [jnp.concatenate([state["prev_" + k], state[k][..., :dim], a[..., :dim]], 1)
               for k, a in (("kv", kv), ("gate", gate))]
        return _take(src[0], i), _take(src[1], i)

    w = start // rate + jnp.arange(n // rate + 1)          # (B, m) candidate windows
    q = w[..., None] * rate + jnp.arange(rate)            # (B, m, rate) their positions
    wkv, wgate = cur(q)
    if overlap:
        wkv, wgate = v4.overlap_slots(*prev(q - rate), wkv, wgate, dim)
    entries = v4.pool_windows(cfg, p, wkv, wgate, w * rate)
    M = state["entries"].shape[1]
    slot = jnp.where((w + 1) * rate <= start + n, w, M)   # closed windows only
    rows = jnp.arange(B)[:, None]
    new = dict(state, entries=state["entries"].at[rows, slot].set(entries, mode="drop"))
    end = start + n
    q = (end // rate * rate + jnp.arange(rate))[:, None]  # (B, 1, rate) the window left open
    kept = (q < end[..., None])[..., None]
    okv, ogate = cur(q)
    new["kv"], new["gate"] = jnp.where(kept, okv, 0)[:, 0], jnp.where(kept, ogate, 0)[:, 0]
    if overlap:
        new["prev_kv"], new["prev_gate"] = (a[:, 0] for a in prev(q - rate))
    return new


def attention(cfg: v4.Config, kind: str, p, x, pos, cache):
    """One V4 attention block of the chunk x (B, n, D) against its layer's cache: (y, the
    new cache). The keys are the window ring's and the chunk's, then the compressed
    entries (all of them, masked by visibility and, for CSA, the indexer's top-k)."""
    B, n, _ = x.shape
    q, kv, q_res, (cos, sin) = v4.project(cfg, kind, p, x, pos)
    keys = jnp.concatenate([cache["win"], kv], axis=1)
    mask = v4.window_mask(cfg, pos, jnp.concatenate([cache["win_pos"], pos], axis=1))
    R = cache["win"].shape[1]
    r = min(n, R)
    rows = jnp.arange(B)[:, None]
    slot = pos[:, -r:] % R
    new = dict(cache, win=cache["win"].at[rows, slot].set(kv[:, -r:]),
               win_pos=cache["win_pos"].at[rows, slot].set(pos[:, -r:]))
    if kind in COMPRESSED:
        rate_name, overlap = COMPRESSED[kind]
        rate, c = getattr(cfg, rate_name), p["compressor"]
        new["compressor"] = compress(cfg, c, cache["compressor"], x, pos, rate, cfg.head_dim,
                                     overlap)
        entries = new["compressor"]["entries"]
        if overlap:
            new["indexer"] = compress(cfg, c["indexer"], cache["indexer"], x, pos, rate,
                                      cfg.index_head_dim, True)
            scores = v4.indexer_scores(cfg, c["indexer"], x, q_res, pos,
                                       keys=new["indexer"]["entries"])
            chosen = v4.index_select(cfg, scores, pos)
        else:
            chosen = v4.visible_entries(rate, entries.shape[1], pos)
        keys = jnp.concatenate([keys, entries], axis=1)
        mask = jnp.concatenate([mask, chosen], axis=-1)
    return v4.attend(cfg, p, q, keys, mask, cos, sin), new


def chunk(cfg: v4.Config, params, cache, tokens, pos, branch):
    """tokens (B, n) at positions ``pos`` (B, n) -> logits (B, n, V), the new cache, info
    (none)."""
    del branch
    new_cache = []

    def attend_layer(i, p, x, given):
        y, c = attention(cfg, cfg.layer_types[i], p, x, pos, cache[i])
        new_cache.append(c)
        return y, {}
    logits, _ = v4.run(cfg, params, tokens, attend_layer, None)
    return logits, new_cache, {}
