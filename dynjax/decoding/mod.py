"""KV-cache decoding of Mixture-of-Depths and staged MoDE (``dynjax.models.mod``).

Top-k over the window cannot be decoded, so a MoD block runs the causal rule of
``mod.decode_config`` (enter when the router's or predictor's logit is positive, while the
block's cache has room); its cache holds only the tokens that entered, and a decode step
runs the block inside one ``lax.cond``, so a skipped block costs the decision alone.
Staged MoDE's entering tokens go to their top-k experts; expert choice is refused.
Depth: docs/decoding.md#mixture-of-depths-and-staged-mode-dynjaxdecodingmodpy
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dynjax.decoding import protocol
from dynjax.decoding.cache import CachedBlock, append_slots, layer_cache
from dynjax.models import mod
from dynjax.models.transformer import ModelConfig

BRANCHES = ("cond", "masked")


def forward_config(cfg: ModelConfig) -> ModelConfig:
    """The config whose sequence forward decoding reproduces: causal routing by the router
    (for a top-k config) or the config's own causal rule, token-order expert buffers."""
    return mod.decode_config(cfg, "router" if cfg.mod.route == "topk" else cfg.mod.route)


def check(cfg: ModelConfig):
    if cfg.variant == "mode_staged" and cfg.moe.routing != "token_choice":
        raise NotImplementedError("KV-cache decoding of mode_staged needs token_choice MoE "
                                  "routing: expert_choice ranks the whole sequence, which a "
                                  "causal decoder has not seen yet")


def layer_params(cfg: ModelConfig, params):
    """[(params of one ModLayer, is it MoD)] in depth order, for scanned or unrolled layers."""
    n_groups, pattern = mod.layout(cfg)
    out = []
    for g in range(n_groups):
        gp = (jax.tree.map(lambda a: a[g], params["layers"]) if cfg.scan_layers
              else params["layers"][f"layer_{g}"])
        out += [(gp[f"sub_{j}"], routed) for j, routed in enumerate(pattern)]
    return out


def init_cache(cfg: ModelConfig, batch: int, max_len: int):
    """Per block: max_len slots (dense) or ``mod.decode_slots`` (MoD); staged MoDE's MoD
    blocks also count the routes each expert has kept."""
    check(cfg)
    n_groups, pattern = mod.layout(cfg)
    def layer(routed):
        c = layer_cache(cfg, batch, mod.decode_slots(cfg, max_len) if routed else max_len)
        if routed and cfg.variant == "mode_staged":
            c["experts"] = jnp.zeros((batch, cfg.moe.num_experts), jnp.int32)
        return c
    return [layer(routed) for _ in range(n_groups) for routed in pattern]


def routed_layer(cfg: ModelConfig, p, h, pos, c, branch):
    """One MoD block on the chunk: the askers that fit enter, in order. With
    ``branch="cond"`` the block runs (``lax.cond`` on the device-side decision, inside the
    step's one compiled program) only when some token enters; "masked" always runs it and
    keeps its result only where a token entered. Returns h, the cache and (B, n) which
    tokens entered."""
    router = lambda h: mod.Router().apply({"params": p["router"]}, h)
    if cfg.mod.route == "predictor":  # the router's score is needed only where the block runs
        ask = mod.Predictor(cfg.mod.predictor_hidden).apply({"params": p["predictor"]}, h) > 0
    else:
        r = router(h)
        ask, router = r > 0, lambda _: r
    S = c["pos"].shape[1]
    enter = ask & (c["n"][:, None] + jnp.cumsum(ask, axis=1) <= S)
    capacity = mod.causal_expert_capacity(cfg, S) if cfg.variant == "mode_staged" else 0
    block = lambda x, x_pos, slot: CachedBlock(cfg, capacity).apply(
        {"params": p["block"]}, x, x_pos, c, slot)[:2]
    weight = lambda s: mod.router_weight(cfg, s)
    if h.shape[1] == 1:  # a decode step: the token is its own slot, nothing to gather
        def run(h):
            update, new = block(h, pos, jnp.where(enter, c["n"][:, None], S))
            w = weight(router(h))[..., None].astype(h.dtype)
            return jnp.where(enter[..., None], h + w * update, h), new
    else:
        idx, valid = mod.first_k_slots(enter, min(h.shape[1], S))
        slot = append_slots(c, valid)
        run = lambda h: mod.routed_update(lambda x, x_pos: block(x, x_pos, slot), h, pos,
                                          router(h), idx, valid, weight)
    if branch == "cond":
        h, c = jax.lax.cond(jnp.any(enter), run, lambda h: (h, c), h)
    else:
        h, c = run(h)
    return h, c, enter


def layers(cfg: ModelConfig, params, cache, h, pos, branch):
    """info: ``entered`` (MoD blocks, B, n), which tokens entered each MoD block."""
    check(cfg)
    if branch not in BRANCHES:
        raise ValueError(f"branch={branch!r}; use one of {BRANCHES}")
    new_cache, entered = [], []
    for (p, routed), c in zip(layer_params(cfg, params), cache):
        if routed:
            h, c, enter = routed_layer(cfg, p, h, pos, c, branch)
            entered.append(enter)
        else:
            update, c, _ = CachedBlock(cfg).apply(
                {"params": p["block"]}, h, pos, c, append_slots(c, jnp.ones(h.shape[:2], bool)))
            h = h + update
        new_cache.append(c)
    B, n = h.shape[:2]
    return h, new_cache, {"entered": jnp.stack(entered) if entered
                          else jnp.zeros((0, B, n), bool)}



def chunk(cfg: ModelConfig, params, cache, tokens, pos, branch):
    """tokens (B, n) at ``pos`` -> logits, the new cache, info (``protocol.core_chunk``)."""
    return protocol.core_chunk(layers, cfg, params, cache, tokens, pos, branch)


positions = protocol.core_positions
