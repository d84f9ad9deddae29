"""Mixture-of-Depths (Raposo et al. 2024): a MoD block processes only k = floor(c*T) tokens.

A router scores each token (r = w.h); the top-k run the core's whole ``Block`` among
themselves at their original positions and add ``weight(r)`` times its update, the others
pass unchanged; every shape is static (top-k, gather, scatter). Causal rules (router or
predictor, trained as auxiliary losses) route without top-k's view of the future; staged
MoDE puts the MoE layer inside the block. Coefficients: the router scores (and, staged, the
MoE probabilities per slot); replay recomputes the selection from them.
Depth: docs/models.md#the-mod-block-dynjaxmodelsmodpy
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from dynjax import coeffs as coeffs_lib
from dynjax.coeffs import Axes
from dynjax.models import moe
from dynjax.models.transformer import (Block, Head, ModelConfig, dense_init, embed_tokens,
                                       scan_layers, take_tokens)

VARIANTS = ("dense", "mod", "mode_staged")
ROUTER_AXES = Axes(("layer", "example", "token"))
MOE_AXES = Axes(("layer", "example", "token", "expert"))  # token: the k routed slots
EMPTY = 2 ** 30  # position of an unused slot: later than every real query, so never seen


# ------------------------------------------------------------------------ configuration

def mod_layer_ids(cfg: ModelConfig) -> tuple[int, ...]:
    if cfg.variant == "dense":
        return ()
    if cfg.mod.layers:
        return tuple(sorted(cfg.mod.layers))
    return tuple(range(cfg.mod.every - 1, cfg.n_layers, cfg.mod.every))


def layout(cfg: ModelConfig) -> tuple[int, tuple[bool, ...]]:
    """(number of groups, which blocks of a group are MoD). One group when irregular."""
    ids = mod_layer_ids(cfg)
    e = cfg.mod.every
    if cfg.mod.layers or cfg.n_layers % e:
        return 1, tuple(i in ids for i in range(cfg.n_layers))
    return cfg.n_layers // e, tuple(cfg.variant != "dense" and j == e - 1 for j in range(e))


def validate(cfg: ModelConfig):
    if cfg.variant == "dense":
        return
    if not 0 < cfg.mod.capacity <= 1:
        raise ValueError(f"model.mod_capacity={cfg.mod.capacity} must be in (0, 1]: a MoD "
                         "block processes k = floor(c * T) of the T tokens")
    if cfg.mod.every < 1:
        raise ValueError(f"model.mod_every={cfg.mod.every} must be at least 1")
    bad = [i for i in cfg.mod.layers if not 0 <= i < cfg.n_layers]
    if bad or len(set(cfg.mod.layers)) != len(cfg.mod.layers):
        raise ValueError(f"model.mod_layers={cfg.mod.layers} must be distinct block indices "
                         f"in 0..{cfg.n_layers - 1}")
    if not mod_layer_ids(cfg):
        raise ValueError(f"no MoD block: mod_every={cfg.mod.every} > n_layers={cfg.n_layers}")
    if cfg.mod.router_weight not in ("raw", "sigmoid"):
        raise ValueError(f"model.mod_router_weight={cfg.mod.router_weight!r}; use 'raw' or "
                         "'sigmoid'")
    if cfg.mod.route not in ("topk", "router", "predictor"):
        raise ValueError(f"model.mod_route={cfg.mod.route!r}; use 'topk', 'router' or "
                         "'predictor'")
    if cfg.mod.decode_slots < 0:
        raise ValueError(f"model.mod_decode_slots={cfg.mod.decode_slots} must be >= 0 "
                         "(0: no limit)")
    if cfg.variant == "mode_staged":
        moe.validate(cfg)
        if cfg.mod.route != "topk" and not moe.is_causal(cfg):
            raise ValueError(
                f"causal routing (mod_route={cfg.mod.route!r}) of mode_staged needs a causal "
                f"MoE: moe_routing='token_choice' with moe_priority='position' (got "
                f"{cfg.moe.routing!r}, {cfg.moe.priority!r}); mod.decode_config sets the "
                "priority, and expert_choice has no causal form")


def eval_routes(cfg: ModelConfig) -> dict:
    """Routing rules an evaluation reports: name -> (config, causal?). Top-k sees the whole
    window, so it is the training objective, never the headline."""
    if cfg.variant == "dense":
        return {"dense": (cfg, True)}
    routes = {"topk": (cfg.replace(mod_route="topk"), False)}
    if cfg.variant == "mode_staged" and cfg.moe.routing != "token_choice":
        return routes  # expert choice has no causal form
    for route in ("router", "predictor"):
        routes[route] = (decode_config(cfg, route), True)
    return routes


def decode_slots(cfg: ModelConfig, seq_len: int) -> int:
    """Slots of a MoD block under causal routing: every token, or the budget N."""
    return seq_len if cfg.mod.decode_slots <= 0 else min(cfg.mod.decode_slots, seq_len)


def causal_expert_capacity(cfg: ModelConfig, n_slots: int) -> int:
    """Staged MoDE's expert buffers under causal routing, sized by the slot budget so they
    never depend on the length; without a budget one route per token per expert never
    fills ``n_slots``."""
    if cfg.mod.decode_slots <= 0:
        return n_slots
    return moe.expert_capacity(cfg, cfg.mod.decode_slots)


def capacity(cfg: ModelConfig, seq_len: int) -> int:
    """k = floor(c * T), the static number of tokens a MoD block processes."""
    k = int(math.floor(cfg.mod.capacity * seq_len + 1e-9))
    if k < 1:
        raise ValueError(f"MoD capacity k = floor({cfg.mod.capacity} * {seq_len}) = 0: a "
                         "block would process no token; raise model.mod_capacity or the "
                         "sequence length")
    return k


def schema(cfg: ModelConfig):
    validate(cfg)  # called once by models.build, so a bad config fails there
    if cfg.variant == "dense":
        return {}
    out = {"router": ROUTER_AXES}
    if cfg.mod.route == "predictor":
        out["predictor"] = ROUTER_AXES
    if cfg.variant == "mode_staged":
        out["moe"] = MOE_AXES
    return out


def router_weight(cfg: ModelConfig, r):
    return jax.nn.sigmoid(r) if cfg.mod.router_weight == "sigmoid" else r


# ----------------------------------------------------------------------- the MoD block

def routed_update(block, h, positions, scores, idx, valid, weight):
    """Run ``block`` on the tokens ``idx`` (B, k) of h (B, T, d) and write back only them.

    Returns the new h and the block's second output (attention statistics, or staged
    MoDE's MoE routing of the k slots). Slots with ``valid`` False (decode mode: fewer than
    k tokens asked to enter) get the EMPTY position, so no real token attends to them, and
    are written back unchanged.
    """
    take = lambda a: take_tokens(a, idx)
    x = take(h)                                                        # (B, k, d)
    routed = positions.take(idx)                                       # original positions
    update, extra = block(x, routed._replace(index=jnp.where(valid, routed.index, EMPTY)))
    w = weight(take(scores))[..., None].astype(x.dtype)
    new = jnp.where(valid[..., None], x + w * update, x)
    scatter = lambda hb, ib, nb: hb.at[ib].set(nb, indices_are_sorted=True, unique_indices=True)
    return jax.vmap(scatter)(h, idx, new), extra


def top_k_slots(scores, k):
    """The k highest-scoring tokens, in their original order."""
    idx = jnp.sort(jax.lax.top_k(scores, k)[1], axis=-1)
    return idx, jnp.ones(idx.shape, bool)


def first_k_slots(enter, k):
    """The first k tokens with ``enter`` True, in order; spare slots are invalid."""
    idx = jnp.sort(jnp.argsort(~enter, axis=-1, stable=True)[:, :k], axis=-1)
    return idx, jnp.take_along_axis(enter, idx, axis=1)


def membership(idx, valid, seq_len):
    """(B, T) bool: which tokens occupy a valid slot."""
    return jnp.any((idx[:, :, None] == jnp.arange(seq_len)) & valid[:, :, None], axis=1)


class Router(nn.Module):
    @nn.compact
    def __call__(self, h):
        return nn.Dense(1, use_bias=False, dtype=jnp.float32, name="proj",
                        kernel_init=dense_init(("embed", None)))(h.astype(jnp.float32))[..., 0]


class Predictor(nn.Module):
    """Small MLP predicting top-k membership from stop-gradient inputs (a logit)."""

    hidden: int

    @nn.compact
    def __call__(self, h):
        x = jax.lax.stop_gradient(h).astype(jnp.float32)
        x = nn.gelu(nn.Dense(self.hidden, name="hidden",
                             kernel_init=dense_init(("embed", None)))(x))
        return nn.Dense(1, name="out", kernel_init=dense_init((None, None)))(x)[..., 0]


def _bce(logits, targets):
    t = targets.astype(jnp.float32)
    return jnp.mean(jnp.maximum(logits, 0) - logits * t + jnp.log1p(jnp.exp(-jnp.abs(logits))))


def choose_slots(cfg, scores, asks):
    """Which tokens a MoD block runs: ``(idx, valid, top_idx, top_valid, asked)``.

    ``scores`` (B, T) are the router's, ``asks`` the logits of the causal rule in force (the
    router's or the predictor's). Top-k of the scores (training) or, under causal routing,
    the tokens whose ``asks`` > 0 up to the slot budget. The top-k slots come back in
    either case: they are what both causal rules learn. Any family with ``cfg.mod`` (a
    :class:`~dynjax.models.sections.ModConfig`) routes by this one rule."""
    T = scores.shape[-1]
    top_idx, top_valid = top_k_slots(scores, capacity(cfg, T))
    asked = asks > 0
    if cfg.mod.route == "topk":
        idx, valid = top_idx, top_valid
    else:  # causal: the tokens that ask, up to the slot budget
        idx, valid = first_k_slots(asked, decode_slots(cfg, T))
    return idx, valid, top_idx, top_valid, asked


def routing_losses(cfg, scores, pred, top_idx, top_valid):
    """The top-k membership (B, T) both causal rules learn (no gradient), and their weighted
    BCE losses: the router's logit and the predictor's each predict it."""
    target = jax.lax.stop_gradient(membership(top_idx, top_valid, scores.shape[-1]))
    return target, {"router_bce": cfg.mod.bce_weight * _bce(scores, target),
                    "predictor_bce": cfg.mod.predictor_weight * _bce(pred, target)}


class StagedBlock(nn.Module):
    """Staged MoDE's block on the k routed tokens: attention, then the MoE FFN. Returns the
    update a + m (as ``Block`` does) and (probs, aux, stats); ``given``: the MoE site's
    :class:`~dynjax.coeffs.Given` (or None). Under causal routing, empty slots (position
    EMPTY) take no expert buffer."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x, positions, given=None):
        cfg = self.cfg
        causal = {} if cfg.mod.route == "topk" else dict(
            valid=positions.index < EMPTY, capacity=causal_expert_capacity(cfg, x.shape[1]))
        a, m, probs, aux, stats = moe.attention_then_moe(cfg, x, positions, given, **causal)
        return a + m, (probs, aux, stats)


class ModLayer(nn.Module):
    """One block: dense (h + F(h)), or MoD with its router. ``given``: this block's
    :class:`~dynjax.coeffs.Given` (values ``{"router", ["predictor"], ["moe"]}``) or None."""

    cfg: ModelConfig
    routed: bool

    @nn.compact
    def __call__(self, h, positions, given):
        cfg = self.cfg
        staged = self.routed and cfg.variant == "mode_staged"
        block = (StagedBlock if staged else Block)(cfg, name="block")
        if not self.routed:
            return h + block(h, positions)[0], None
        T = h.shape[1]
        pred = Predictor(cfg.mod.predictor_hidden, name="predictor")(h)
        computed = {"router": Router(name="router")(h)}
        if cfg.mod.route == "predictor":
            computed["predictor"] = pred
        own = coeffs_lib.part(given, lambda v: {k: v[k] for k in computed})  # not "moe"
        coeffs = coeffs_lib.site(computed, own)
        # Not for replay (one program either way): without this barrier XLA:CPU schedules
        # the routed block differently and training moves in the last bits, so it stays to
        # keep behaviour bitwise (scripts/check_digests.py: mod, mode_staged params).
        h, coeffs = jax.lax.optimization_barrier((h, coeffs))
        scores = coeffs["router"]
        idx, valid, top_idx, top_valid, asked = choose_slots(
            cfg, scores, coeffs["predictor"] if cfg.mod.route == "predictor" else scores)
        run = (lambda x, p: block(x, p, coeffs_lib.part(given, lambda v: v["moe"]))) \
            if staged else block
        h, extra = routed_update(run, h, positions, scores, idx, valid,
                                 lambda r: router_weight(cfg, r))
        target, aux = routing_losses(cfg, scores, pred, top_idx, top_valid)
        entered = membership(idx, valid, T)
        overflow = (asked & ~entered) if cfg.mod.route != "topk" else jnp.zeros_like(entered)
        stats = {"topk": target, "entered": entered, "overflow": overflow,
                 "router_says": scores > 0, "predictor_says": pred > 0}
        if staged:  # the k slots' MoE routing is a coefficient too; its losses and load
            probs, moe_aux, moe_stats = extra
            coeffs = dict(coeffs, moe=probs)
            aux.update(moe_aux)
            stats.update({f"moe_{k}": v for k, v in moe_stats.items()})
        return h, (coeffs, aux, stats)


class ModGroup(nn.Module):
    """Consecutive blocks, ``pattern[j]`` True where block j is MoD; scanned over groups."""

    cfg: ModelConfig
    pattern: tuple

    @nn.compact
    def __call__(self, carry, xs):
        h, positions = carry
        outs = []
        for j, routed in enumerate(self.pattern):
            given = coeffs_lib.part(xs, lambda v, i=len(outs): jax.tree.map(lambda a: a[i], v))
            h, out = ModLayer(self.cfg, routed, name=f"sub_{j}")(h, positions, given)
            if routed:
                outs.append(out)
        return (h, positions), (jax.tree.map(lambda *a: jnp.stack(a), *outs) if outs else None)


class ModDecoder(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens, given=None):
        """``given``: a :class:`~dynjax.coeffs.Given` of the schema's coefficients or None."""
        cfg = self.cfg
        h, positions = embed_tokens(cfg, tokens)
        n_groups, pattern = layout(cfg)
        xs = None if cfg.variant == "dense" else coeffs_lib.part(
            given, lambda v: jax.tree.map(lambda a: a.reshape((n_groups, -1) + a.shape[1:]), v),
            n_groups)
        (h, _), out = scan_layers(ModGroup, cfg, n_groups, pattern=pattern)((h, positions), xs)
        logits = Head(cfg, name="head")(h)
        if out is None:
            return logits, {}
        recorded, aux, stats = jax.tree.map(lambda a: a.reshape((-1,) + a.shape[2:]), out)
        moe.sow_routing(self, aux, "mod_stats", stats)   # aux: mean over MoD blocks
        return logits, recorded


# ------------------------------------------------------------------------ causal rules

def decode_config(cfg: ModelConfig, route: str = "router") -> ModelConfig:
    """The same model routed causally ("router" threshold or "predictor"); staged MoDE's
    expert buffers then fill in token order."""
    return cfg.replace(mod_route=route, moe_priority="position")
