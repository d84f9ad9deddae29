"""KV-cache decoding for every language-model family, one interface.

    cache = init_cache(cfg, batch, max_len)
    logits, cache, info = prefill(cfg, params, prompt, max_len)      # the prompt in one pass
    logits, cache, info = decode_step(cfg, params, cache, token, pos) # then one token a step
    logits, info = cached_forward(cfg, params, tokens)               # teacher forcing
    tokens = generate(cfg, params, prompt, steps)                     # greedy
    cache_bytes(cache)

``params`` are the family's own (``build(cfg).init``): the decoder applies the model's
modules and parameters to one token (or a prompt) against a cache, never a copy of its
arithmetic. A cache is a list with one dict of fixed-shape arrays per attention layer
(``dynjax.decoding.cache``), so every step has static shapes and ``decode_step`` jits once.

What decoding equals: the sequence forward of ``forward_config(cfg)`` within float
tolerance, at every position. For gates and MUDD that is the model itself. MoD and staged
MoDE route causally (``dynjax.decoding.mod``); MoE expert buffers fill in token order and
are sized for a window of max_len (``dynjax.decoding.moe``). ``info`` says what ran, per
layer and token: ``gate`` (gates: the multiplier of each block's update), ``entered`` (MoD:
which tokens entered each MoD block), ``ffn_ran`` (MoE: whether an expert took the token).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dynjax.decoding import gates, mod, moe, mudd
from dynjax.models.transformer import (Embed, Head, ModelConfig, Positions, token_positions,
                                       window_positions)

FAMILIES = {"gates": gates, "mod": mod, "moe": moe, "mudd": mudd}
BRANCHES = mod.BRANCHES


def _family(cfg: ModelConfig):
    if cfg.family not in FAMILIES:
        raise NotImplementedError(f"no KV-cache decoder for model.family={cfg.family!r}; "
                                  f"decodable: {sorted(FAMILIES)}")
    return FAMILIES[cfg.family]


def forward_config(cfg: ModelConfig) -> ModelConfig:
    """The config whose full-sequence forward the decoder reproduces (see module doc)."""
    fam = _family(cfg)
    return fam.forward_config(cfg) if hasattr(fam, "forward_config") else cfg


def init_cache(cfg: ModelConfig, batch: int, max_len: int):
    """An empty cache for ``batch`` sequences of up to ``max_len`` tokens."""
    return _family(cfg).init_cache(cfg, batch, max_len)


def cache_bytes(cache) -> int:
    """Bytes of the cached keys and values (positions and counters are not counted)."""
    return sum(layer[n].nbytes for layer in cache for n in ("k", "v"))


def _chunk(cfg: ModelConfig, params, cache, tokens, positions: Positions, branch):
    """tokens (B, n) at ``positions`` -> logits (B, n, V), cache, info (leaves (layers, B, n))."""
    h = Embed(cfg).apply({"params": params["embed"]}, tokens)
    h, cache, info = _family(cfg).layers(cfg, params, cache, h, positions, branch)
    return Head(cfg).apply({"params": params["head"]}, h), cache, info


def decode_step(cfg: ModelConfig, params, cache, token, pos, branch: str = "cond"):
    """One token per sequence, ``token`` (B,) at positions ``pos`` (B,) -> logits (B, V), the
    new cache, info (leaves (layers, B)). ``branch`` (MoD): "cond" runs a MoD block only
    when some sequence's token enters it; "masked" always runs it, keeping the result only
    where a token entered. Either way the cache grows only for the entering tokens."""
    logits, cache, info = _chunk(cfg, params, cache, token[:, None],
                                 token_positions(cfg, pos[:, None]), branch)
    return logits[:, 0], cache, jax.tree.map(lambda a: a[..., 0], info)


def prefill(cfg: ModelConfig, params, prompt, max_len: int | None = None):
    """The prompt (B, P) in one parallel pass into an empty cache for ``max_len`` tokens
    (default P): logits (B, P, V), the cache (ready for ``decode_step`` at position P) and
    info (leaves (layers, B, P))."""
    B, P = prompt.shape
    cache = init_cache(cfg, B, max_len or P)
    return _chunk(cfg, params, cache, prompt, window_positions(cfg, B, P), "cond")


def cached_forward(cfg: ModelConfig, params, tokens, branch: str = "cond", max_len=None):
    """Logits (B, T, V) of every position computed token by token through ``decode_step``
    (teacher forcing) with a cache for ``max_len`` tokens (default T), and info (leaves
    (layers, B, T))."""
    B, T = tokens.shape

    def step(cache, t):
        logits, cache, info = decode_step(cfg, params, cache, tokens[:, t], jnp.full((B,), t),
                                          branch)
        return cache, (logits, info)
    _, (logits, info) = jax.lax.scan(step, init_cache(cfg, B, max_len or T), jnp.arange(T))
    return jnp.swapaxes(logits, 0, 1), jax.tree.map(lambda a: jnp.moveaxis(a, 0, -1), info)


def generate(cfg: ModelConfig, params, prompt, steps: int):
    """Greedy continuation of ``prompt`` (B, P) by ``steps`` tokens: prefill, then one
    ``decode_step`` per new token. Returns (B, P + steps)."""
    B, P = prompt.shape
    logits, cache, _ = prefill(cfg, params, prompt, P + steps)
    first = jnp.argmax(logits[:, -1], -1).astype(prompt.dtype)

    def step(carry, t):
        cache, tok = carry
        logits, cache, _ = decode_step(cfg, params, cache, tok, jnp.full((B,), t))
        nxt = jnp.argmax(logits, -1).astype(prompt.dtype)
        return (cache, nxt), nxt
    _, out = jax.lax.scan(step, (cache, first), jnp.arange(P, P + steps - 1))
    return jnp.concatenate([prompt, first[:, None], out.T], axis=1)
