"""KV-cache decoding for every language-model family, one interface.

    logits, cache, info = prefill(cfg, params, prompt, max_len)       # then decode_step(...)
    tokens = generate(cfg, params, prompt, steps, Sampling(0.8, top_p=0.9), key)

The decoder applies the family's own modules and parameters to a token (or a prompt)
against a cache of fixed-shape arrays (``decoding.cache``: ``decode_step`` jits once), and
equals the sequence forward of ``forward_config(cfg)`` at every position; ``info`` says
what ran per layer and token. Depth: docs/decoding.md#the-interface-dynjaxdecoding__init__py
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dynjax.decoding import deepseek_v4, gates, llm, mod, moe, mudd
from dynjax.decoding.protocol import FamilyDecoder
from dynjax.decoding.sampling import Sampling, next_token
from dynjax.models.transformer import ModelConfig, Positions

GREEDY = Sampling()
FAMILIES: dict[str, FamilyDecoder] = {"gates": gates, "mod": mod, "moe": moe, "mudd": mudd,
                                      "llm": llm, "deepseek_v4": deepseek_v4}
# the families with no KV-cache decoder, and why (dynjax.models.FAMILIES names every family)
REFUSED = {"gated_mlp": "a classifier of whole examples: there are no tokens to decode",
           "muddpythia": "the MUDDPythia reference port is checked against its logits only; "
                         "decode by re-running the forward"}
BRANCHES = mod.BRANCHES


def _family(cfg: ModelConfig) -> FamilyDecoder:
    if not isinstance(getattr(cfg, "family", None), str):
        raise TypeError(f"the decoder takes a model config, not {type(cfg).__name__}: pass "
                        "(target.model.cfg, target.params) of an opened checkpoint, or "
                        "(model.cfg, params) of dynjax.models.build")
    if cfg.family not in FAMILIES:
        why = f" ({REFUSED[cfg.family]})" if cfg.family in REFUSED else ""
        raise NotImplementedError(f"no KV-cache decoder for model.family={cfg.family!r}{why}; "
                                  f"decodable: {sorted(FAMILIES)}")
    return FAMILIES[cfg.family]


def forward_config(cfg: ModelConfig) -> ModelConfig:
    """The config whose full-sequence forward the decoder reproduces (see module doc)."""
    return _family(cfg).forward_config(cfg)


def init_cache(cfg: ModelConfig, batch: int, max_len: int):
    """An empty cache for ``batch`` sequences of up to ``max_len`` tokens."""
    return _family(cfg).init_cache(cfg, batch, max_len)


def cache_bytes(cache) -> int:
    """Bytes of the cache's floating arrays: keys, values, compressed entries, compressor
    and recurrent states (positions and counters are not counted)."""
    return sum(a.nbytes for a in jax.tree.leaves(cache) if jnp.issubdtype(a.dtype, jnp.floating))


def _positions(cfg, index, bound=None) -> Positions:
    """Rotary positions of tokens at ``index`` (B, n): the family's own."""
    return _family(cfg).positions(cfg, index, bound)


def _chunk(cfg: ModelConfig, params, cache, tokens, positions: Positions, branch):
    """tokens (B, n) at ``positions`` -> logits (B, n, V), cache, info (leaves (layers, B, n))."""
    return _family(cfg).chunk(cfg, params, cache, tokens, positions, branch)


def decode_step(cfg: ModelConfig, params, cache, token, pos, branch: str = "cond"):
    """One token per sequence, ``token`` (B,) at positions ``pos`` (B,) -> logits (B, V), the
    new cache, info (leaves (layers, B)). ``branch`` (MoD): "cond" runs a MoD block only
    when some sequence's token enters it; "masked" always runs it, keeping the result only
    where a token entered. Either way the cache grows only for the entering tokens."""
    logits, cache, info = _chunk(cfg, params, cache, token[:, None],
                                 _positions(cfg, pos[:, None]), branch)
    return logits[:, 0], cache, jax.tree.map(lambda a: a[..., 0], info)


def prefill(cfg: ModelConfig, params, prompt, max_len: int | None = None):
    """The prompt (B, P) in one parallel pass into an empty cache for ``max_len`` tokens
    (default P): logits (B, P, V), the cache (ready for ``decode_step`` at position P) and
    info (leaves (layers, B, P))."""
    B, P = prompt.shape
    cache = init_cache(cfg, B, max_len or P)
    index = jnp.broadcast_to(jnp.arange(P), (B, P))
    return _chunk(cfg, params, cache, prompt, _positions(cfg, index, bound=P), "cond")


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


def generate(cfg: ModelConfig, params, prompt, steps: int, sampling: Sampling = GREEDY,
             key=None):
    """Continuation of ``prompt`` (B, P) by ``steps`` tokens: prefill, then one
    ``decode_step`` per new token, each chosen by ``sampling`` (greedy by default; a sampled
    continuation needs ``key``, split once per token). Returns (B, P + steps)."""
    if not sampling.greedy and key is None:
        raise ValueError("sampling with temperature > 0 needs a PRNG key: "
                         "generate(..., key=jax.random.key(seed))")
    _family(cfg)   # a wrong first argument: one line, before the prompt is read
    B, P = prompt.shape
    keys = jax.random.split(jax.random.key(0) if key is None else key, steps)
    logits, cache, _ = prefill(cfg, params, prompt, P + steps)
    first = next_token(logits[:, -1], keys[0], sampling).astype(prompt.dtype)

    def step(carry, xs):
        cache, tok = carry
        t, k = xs
        logits, cache, _ = decode_step(cfg, params, cache, tok, jnp.full((B,), t))
        nxt = next_token(logits, k, sampling).astype(prompt.dtype)
        return (cache, nxt), nxt
    _, out = jax.lax.scan(step, (cache, first), (jnp.arange(P, P + steps - 1), keys[1:]))
    return jnp.concatenate([prompt, first[:, None], out.T], axis=1)


def stream(cfg: ModelConfig, params, prompt, steps: int, sampling: Sampling = GREEDY, key=None):
    """The tokens ``generate`` would append, yielded one step at a time ((B,) each) so a
    program can print them as they come: the same prefill, keys and ``decode_step``, driven
    from Python through one compiled step instead of ``lax.scan``."""
    if not sampling.greedy and key is None:
        raise ValueError("sampling with temperature > 0 needs a PRNG key: "
                         "stream(..., key=jax.random.key(seed))")
    _family(cfg)
    B, P = prompt.shape
    keys = jax.random.split(jax.random.key(0) if key is None else key, steps)
    logits, cache, _ = jax.jit(prefill, static_argnums=(0, 3))(cfg, params, prompt, P + steps)
    tok = next_token(logits[:, -1], keys[0], sampling).astype(prompt.dtype)
    yield tok

    @jax.jit
    def step(params, cache, tok, t, k):
        logits, cache, _ = decode_step(cfg, params, cache, tok, jnp.full((B,), t))
        return cache, next_token(logits, k, sampling).astype(prompt.dtype)
    for i, t in enumerate(range(P, P + steps - 1)):
        cache, tok = step(params, cache, tok, t, keys[i + 1])
        yield tok
