"""Predicted skipping: a trained FeatureGate model that runs a block only for the tokens a
pre-block predictor expects to get a large gate, so removed updates are never computed.

A stop-gradient MLP on h[l] (MoD's ``mod.Predictor``, fitted post hoc by
``dynjax.measure.skip_predictors``) decides before block l; execution reuses MoD's fixed
slots and routed update. A skipped token keeps h[l] and is no key of block l. What a
skipped token sees, the KL feature across skipped blocks and the cached decoder:
docs/decoding.md (Predicted skipping).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dynjax.decoding.cache import CachedBlock, append_slots, layer_cache, layer_slices
from dynjax.models import gates, mod
from dynjax.models.transformer import (MASK_VALUE, Embed, Head, ModelConfig,
                                       Positions, attention_scores, take_tokens,
                                       token_positions, window_positions)

BRANCHES = ("cond", "masked")


def check(cfg: ModelConfig):
    if (cfg.family, cfg.variant) != ("gates", "feature_gate"):
        raise ValueError(f"predicted skipping needs a gates/feature_gate model, got "
                         f"{cfg.family}/{cfg.variant}")


def init_cache(cfg: ModelConfig, batch: int, slots) -> list:
    """Per block, a cache of ``slots[l]`` tokens: the block's fixed capacity."""
    check(cfg)
    if len(slots) != cfg.n_layers or min(slots) < 1:
        raise ValueError(f"slots={list(slots)}: need {cfg.n_layers} positive block capacities")
    caches = []
    for s in slots:
        c = layer_cache(cfg, batch, int(s))
        caches.append(dict(c, kp=jnp.zeros_like(c["k"])))
    return caches


def _put(a, idx, valid, new):
    """a with rows ``idx`` replaced by ``new`` where ``valid``."""
    new = jnp.where(valid.reshape(valid.shape + (1,) * (a.ndim - 2)), new, take_tokens(a, idx))
    return jax.vmap(lambda ab, ib, nb: ab.at[ib].set(nb, unique_indices=True))(a, idx, new)


def reference_logp(q_prev, k_prev, logits):
    """Log-probabilities (B, H, n, S) of the carried reference attention q_prev . k_prev over
    the keys ``logits`` (masked with MASK_VALUE) sees; masked where it is."""
    s = jnp.where(logits > MASK_VALUE, attention_scores(q_prev, k_prev), MASK_VALUE)
    return s - jax.nn.logsumexp(s, axis=-1, keepdims=True)


def asks(cfg: ModelConfig, predictor, h):
    """(B, n) bool: the tokens whose predictor logit is positive (None: every token)."""
    if predictor is None:
        return jnp.ones(h.shape[:2], bool)
    hidden = predictor["hidden"]["kernel"].shape[-1]
    return mod.Predictor(hidden).apply({"params": predictor}, h) > 0


def _layer(cfg, p, predictor, c, h, pos, ref, branch):
    """Block l on the chunk h (B, n, d) for the tokens that ask and fit. ``ref`` = the
    chunk's carried (query, key) references. Returns h, cache, ref, (asked, entered, gate)."""
    ask = asks(cfg, predictor, h)
    S = c["pos"].shape[1]
    enter = ask & (c["n"][:, None] + jnp.cumsum(ask, axis=1) <= S)
    idx, valid = mod.first_k_slots(enter, min(h.shape[1], S))
    slot = append_slots(c, valid)
    rows = jnp.arange(slot.shape[0])[:, None]

    def run(state):
        h, c, (q_ref, k_ref) = state
        c = dict(c, kp=c["kp"].at[rows, slot].set(take_tokens(k_ref, idx), mode="drop"))
        out = {}

        def block(x, x_pos):  # the gated update, so routed_update's weight is 1
            (update, c_new, (logits, lse, _)), sown = CachedBlock(cfg).apply(
                {"params": p["block"]}, x, x_pos, c, slot, mutable=["intermediates"])
            ref_logp = reference_logp(take_tokens(q_ref, idx), c_new["kp"], logits)
            per_head = gates.row_features(logits, lse, ref_logp)
            g = gates.Controller(cfg).apply({"params": p["controller"]},
                                            gates.attention_features(per_head, update, x))
            attn = sown["intermediates"]["attn"]
            out.update(c=c_new, q=attn["rotary_query"][0], k=attn["rotary_key"][0], g=g)
            return g[..., None].astype(x.dtype) * update, None

        h, _ = mod.routed_update(block, h, pos, jnp.ones(h.shape[:2]), idx, valid, lambda w: w)
        ref = (_put(q_ref, idx, valid, out["q"]), _put(k_ref, idx, valid, out["k"]))
        gate = _put(jnp.zeros(h.shape[:2]), idx, valid, out["g"])
        return h, out["c"], ref, gate

    state = (h, c, ref)
    if branch == "cond":
        h, c, ref, gate = jax.lax.cond(jnp.any(enter), run, lambda s: s + (
            jnp.zeros(h.shape[:2]),), state)
    else:
        h, c, ref, gate = run(state)
    return h, c, ref, (ask, mod.membership(idx, valid, h.shape[1]), gate)


def chunk(cfg: ModelConfig, params, predictor, cache, tokens, pos: Positions,
          branch: str = "cond", keep_inputs: bool = False):
    """tokens (B, n) at ``pos`` -> logits (B, n, V), the caches, info (leaves (layers, B, n)):
    ``asked``, ``entered`` (asked and fitted: the block ran for it), ``gate`` (the gate of
    its update, 0 where skipped) and with ``keep_inputs`` ``h`` (layers, B, n, d), each
    block's input. ``predictor``: stacked per-block ``mod.Predictor`` params, or None (every
    token asks)."""
    check(cfg)
    if branch not in BRANCHES:
        raise ValueError(f"branch={branch!r}; use one of {BRANCHES}")
    h = Embed(cfg).apply({"params": params["embed"]}, tokens)
    zeros = jnp.zeros(tokens.shape + (cfg.n_heads, cfg.head_dim), cfg.compute_dtype)
    ref, new_cache, info = (zeros, zeros), [], []
    for l, (p, c) in enumerate(zip(layer_slices(cfg, params["layers"], cfg.n_layers), cache)):
        pred = None if predictor is None else jax.tree.map(lambda a, l=l: a[l], predictor)
        h_in = h
        h, c, ref, (ask, entered, gate) = _layer(cfg, p, pred, c, h, pos, ref, branch)
        new_cache.append(c)
        info.append(dict(asked=ask, entered=entered, gate=gate,
                         **({"h": h_in} if keep_inputs else {})))
    logits = Head(cfg).apply({"params": params["head"]}, h)
    return logits, new_cache, jax.tree.map(lambda *a: jnp.stack(a), *info)


def forward(cfg: ModelConfig, params, predictor, tokens, slots=None, branch="cond",
            keep_inputs=False):
    """The window (B, T) in one pass (a prefill into empty caches of ``slots`` per block,
    default T: no capacity limit): logits and info as ``chunk``."""
    B, T = tokens.shape
    cache = init_cache(cfg, B, [T] * cfg.n_layers if slots is None else slots)
    logits, _, info = chunk(cfg, params, predictor, cache, tokens, window_positions(cfg, B, T),
                            branch, keep_inputs)
    return logits, info


def decode_step(cfg: ModelConfig, params, predictor, cache, token, pos, branch="cond"):
    """One token per sequence (B,) at positions ``pos`` (B,): logits (B, V), the caches,
    info (leaves (layers, B)). A block runs only when some sequence's token enters it."""
    logits, cache, info = chunk(cfg, params, predictor, cache, token[:, None],
                                token_positions(cfg, pos[:, None]), branch)
    return logits[:, 0], cache, jax.tree.map(lambda a: a[..., 0], info)


def cached_forward(cfg: ModelConfig, params, predictor, tokens, slots=None, branch="cond"):
    """Logits (B, T, V) and info (leaves (layers, B, T)) token by token through
    ``decode_step`` (teacher forcing) with caches of ``slots`` (default T) per block."""
    B, T = tokens.shape

    def step(cache, t):
        logits, cache, info = decode_step(cfg, params, predictor, cache, tokens[:, t],
                                          jnp.full((B,), t), branch)
        return cache, (logits, info)
    cache = init_cache(cfg, B, [T] * cfg.n_layers if slots is None else slots)
    _, (logits, info) = jax.lax.scan(step, cache, jnp.arange(T))
    return jnp.swapaxes(logits, 0, 1), jax.tree.map(lambda a: jnp.moveaxis(a, 0, -1), info)
