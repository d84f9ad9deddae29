"""Mixture-of-Experts feed-forward blocks with fixed expert capacity, and integrated MoDE.

Every block is ``h + a + MoE(norm(h + a))``: the core's attention, then E expert MLPs of
which each token reaches at most k. Router: p = softmax(W x) over experts (float32).

Routing (``moe_routing``), both with static shapes (one-hot dispatch / combine tensors
[B, T, E, C], GShard style; the group is one sequence):

- ``token_choice``: each token picks its top-k experts, weight p_e (not renormalised).
  Expert buffers hold C = ceil(capacity_factor * k * T / E) tokens (capped at T;
  capacity_factor <= 0 means C = T, nothing is ever dropped). Buffer slots are filled in
  priority order, ``moe_priority``: "choice" (GShard) puts every token's first choice, in
  token order, before any second choice, so with top-k >= 2 and a binding capacity a
  token's second choice queues behind LATER tokens' first choices (not causal);
  "position" fills them in token order (all of token t's choices before token t+1's), so
  whether a route is kept depends only on earlier tokens (causal).
  A (token, expert) pair that finds the buffer full is DROPPED: that expert contributes
  nothing for the token; if all its choices drop, the token's FFN update is exactly 0
  (it keeps the residual). Reported as ``dropped`` in ``dynjax.measure.lm_execution.moe_stats``.
- ``expert_choice`` (Zhou et al. 2022): each expert takes its top-C tokens by p_e, so
  load is balanced by construction; a token no expert chose is dropped.

Auxiliary losses (sown, already weighted): ``load_balance`` = E * sum_e f_e P_e (Switch;
f_e the fraction of token-choice assignments to e, P_e the mean router probability; 1 at
uniform routing; token choice only) and ``router_z`` = mean(logsumexp(logits)^2) (ST-MoE).

Integrated MoDE (variant ``mode_integrated``, Raposo et al. 2024): the router has E + 1
outputs; the last is a no-op expert with no parameters and no buffer. A token routed there
skips the MLP (its update is just its attention output), so the layer computes only the
E real experts' buffers, C = ceil(cf * k * T / (E + 1)) each.

Dispatch (``moe_dispatch``): "onehot" is the GShard form above (the default, as existing
runs were trained); "dropless" (token choice only) sends every token to each of its top-k
experts through ``dynjax.models.dispatch``, what the one-hot form computes with
``moe_capacity_factor <= 0`` within float rounding (docs/moe.md).

Coefficients: ``{"router": (layer, example, token, expert)}``, the router probabilities.
Replay recomputes the selection, capacity and weights from them.
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from dynjax import coeffs as coeffs_lib
from dynjax.coeffs import Axes
from dynjax.models import dispatch as dispatch_lib
from dynjax.models.activation_sharding import BUFFER_HIDDEN, BUFFERS, TOKENS, constrain
from dynjax.models.transformer import (Attention, Head, ModelConfig, dense_init, embed_tokens, norm,
                                       scan_layers)

VARIANTS = ("moe", "mode_integrated")
DISPATCHES = ("onehot", "dropless")
ROUTER_AXES = Axes(("layer", "example", "token", "expert"))


def n_routes(cfg: ModelConfig) -> int:
    """Router outputs: the experts, plus the no-op expert of integrated MoDE."""
    return cfg.moe.num_experts + (cfg.variant == "mode_integrated")


def validate(cfg: ModelConfig):
    if cfg.moe.num_experts < 1:
        raise ValueError(f"model.moe_num_experts={cfg.moe.num_experts} must be at least 1")
    if not 1 <= cfg.moe.num_experts_per_tok <= n_routes(cfg):
        raise ValueError(f"model.moe_num_experts_per_tok={cfg.moe.num_experts_per_tok} must "
                         f"be in 1..{n_routes(cfg)} (the router's outputs)")
    if cfg.moe.routing not in ("token_choice", "expert_choice"):
        raise ValueError(f"model.moe_routing={cfg.moe.routing!r}; use 'token_choice' or "
                         "'expert_choice'")
    if cfg.moe.routing == "expert_choice" and cfg.moe.capacity_factor <= 0:
        raise ValueError("expert_choice routing needs model.moe_capacity_factor > 0")
    if cfg.moe.dispatch not in DISPATCHES:
        raise ValueError(f"model.moe_dispatch={cfg.moe.dispatch!r}; use 'onehot' (GShard "
                         "buffers) or 'dropless' (sort by expert)")
    if cfg.moe.dispatch == "dropless" and cfg.moe.routing != "token_choice":
        raise ValueError("model.moe_dispatch='dropless' needs moe_routing='token_choice' "
                         "(expert choice has capacity by definition)")
    if cfg.moe.priority not in ("choice", "position"):
        raise ValueError(f"model.moe_priority={cfg.moe.priority!r}; use 'choice' (GShard) or "
                         "'position' (causal)")


def is_causal(cfg: ModelConfig) -> bool:
    """Does the sequence form's routing of token t depend only on tokens <= t? Expert choice
    ranks the whole sequence; choice-major buffers do too once a second choice can drop."""
    if cfg.moe.routing == "expert_choice":
        return False
    return (dropless(cfg) or cfg.moe.priority == "position" or cfg.moe.num_experts_per_tok == 1
            or cfg.moe.capacity_factor <= 0)


def dropless(cfg: ModelConfig) -> bool:
    return cfg.moe.dispatch == "dropless"


def expert_capacity(cfg: ModelConfig, seq_len: int) -> int:
    """Tokens each expert's buffer holds per sequence (dropless: every token)."""
    if cfg.moe.capacity_factor <= 0 or dropless(cfg):
        return seq_len
    c = math.ceil(cfg.moe.capacity_factor * cfg.moe.num_experts_per_tok * seq_len
                  / n_routes(cfg) - 1e-9)
    return max(1, min(seq_len, c))


def schema(cfg: ModelConfig):
    validate(cfg)
    return {"router": ROUTER_AXES}


def token_choice(probs, k, capacity, valid=None, by_position=False):
    """Top-k experts per token -> (dispatch, combine), both (B, T, E, C), and kept (B,T,k).
    Tokens with ``valid`` False take no buffer slot; ``by_position``: token-order priority."""
    B, T, E = probs.shape
    gates, experts = jax.lax.top_k(probs, k)                       # (B, T, k)
    choice = jax.nn.one_hot(experts, E, dtype=jnp.int32)          # (B, T, k, E)
    if valid is not None:
        choice = choice * valid[:, :, None, None]
    if by_position:   # a token's k choices are distinct experts: no order among them
        pos = (jnp.cumsum(choice.reshape(B, T * k, E), axis=1) - 1).reshape(B, T, k, E)
    else:             # GShard: every first choice before any second choice
        by_rank = jnp.swapaxes(choice, 1, 2).reshape(B, k * T, E)
        pos = (jnp.cumsum(by_rank, axis=1) - 1).reshape(B, k, T, E).swapaxes(1, 2)
    kept = choice * (pos < capacity)                               # (B, T, k, E)
    slot = jax.nn.one_hot(pos, capacity) * kept[..., None]         # (B, T, k, E, C)
    return slot.sum(2), (slot * gates[..., None, None]).sum(2), kept.sum(-1)


def expert_choice(probs, capacity):
    """Each expert takes its top-C tokens -> (dispatch, combine), both (B, T, E, C)."""
    T = probs.shape[1]
    gates, tokens = jax.lax.top_k(jnp.swapaxes(probs, 1, 2), capacity)   # (B, E, C)
    dispatch = jnp.moveaxis(jax.nn.one_hot(tokens, T), -1, 1)             # (B, T, E, C)
    return dispatch, dispatch * gates[:, None]


def router_layer(cfg: ModelConfig):
    """Every MoE FFN's "router": float32 logits over the routes (experts, plus a no-op)."""
    return nn.Dense(n_routes(cfg), use_bias=False, dtype=jnp.float32, name="router",
                    kernel_init=dense_init(("embed", None)))


def expert_kernels(module: nn.Module, cfg: ModelConfig, d: int):
    """Every MoE FFN's expert weights ``wi`` (E, d, d_ff) and ``wo`` (E, d_ff, d)."""
    E = cfg.moe.num_experts
    return (module.param("wi", dense_init(("expert", "embed", "mlp")), (E, d, cfg.d_ff)),
            module.param("wo", dense_init(("expert", "mlp", "embed")), (E, cfg.d_ff, d)))


class MoeFfn(nn.Module):
    """x (B, T, d) -> (y, probs, aux, stats). The router always runs; ``given`` (a
    :class:`~dynjax.coeffs.Given` of the probabilities, or None) decides which are used."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x, given=None, valid=None, capacity=None):
        """``valid`` (B, T): tokens that may take buffer slots (all when None); ``capacity``:
        the expert buffer size (default ``expert_capacity(cfg, T)``)."""
        cfg = self.cfg
        B, T, d = x.shape
        E, k = cfg.moe.num_experts, cfg.moe.num_experts_per_tok
        logits = router_layer(cfg)(x.astype(jnp.float32))
        probs = coeffs_lib.site(jax.nn.softmax(logits, axis=-1), given)
        aux = {"router_z": cfg.moe.router_z_loss_weight * jnp.mean(
            jax.nn.logsumexp(logits, axis=-1) ** 2)}
        if dropless(cfg):
            y, routes_aux, stats = dropless_ffn(cfg, x, probs, *expert_kernels(self, cfg, d),
                                                valid)
            return y, probs, dict(aux, **routes_aux), stats
        C = expert_capacity(cfg, T) if capacity is None else capacity
        if cfg.moe.routing == "token_choice":
            dispatch, combine, kept = token_choice(probs, k, C, valid,
                                                   cfg.moe.priority == "position")
            top1 = jax.nn.one_hot(jax.lax.top_k(probs, k)[1], n_routes(cfg)).sum(2) / k
            aux["load_balance"] = cfg.moe.load_balance_loss_weight * n_routes(cfg) * jnp.sum(
                top1.mean((0, 1)) * probs.mean((0, 1)))
            n_valid = k * (B * T if valid is None else jnp.maximum(valid.sum(), 1))
            dropped = 1.0 - kept.sum() / n_valid
        else:
            dispatch, combine = expert_choice(probs, C)
            dropped = jnp.mean(dispatch.sum((2, 3)) == 0)
        noop = dispatch[:, :, E:].sum((2, 3)).mean() if n_routes(cfg) > E else jnp.zeros(())
        dispatch, combine = dispatch[:, :, :E], combine[:, :, :E]  # the no-op expert: nothing
        wi, wo = expert_kernels(self, cfg, d)
        dt = cfg.compute_dtype
        xe = constrain(jnp.einsum("btec,btd->becd", dispatch.astype(dt), x), BUFFERS)
        he = constrain(jnp.einsum("becd,edf->becf", xe, wi.astype(dt)), BUFFER_HIDDEN)
        ye = constrain(jnp.einsum("becf,efd->becd", nn.gelu(he), wo.astype(dt)), BUFFERS)
        y = constrain(jnp.einsum("btec,becd->btd", combine.astype(dt), ye), TOKENS)
        stats = {"dropped": dropped, "noop": noop, "load": dispatch.sum((1, 3)).mean(0) / T,
                 "ffn_ran": dispatch.sum((2, 3)) > 0}  # (B, T): some real expert took it
        return y, probs, aux, stats


def dropless_ffn(cfg: ModelConfig, x, probs, wi, wo, valid=None):
    """MoeFfn's token-choice arithmetic without capacity: -> (y, aux, stats) as the one-hot
    form computes them with capacity_factor <= 0, from per-route counts instead of
    [B, T, E, C] tensors. Tokens with ``valid`` False and no-op routes go nowhere."""
    B, T, d = x.shape
    E, k, R = cfg.moe.num_experts, cfg.moe.num_experts_per_tok, n_routes(cfg)
    gates, experts = jax.lax.top_k(probs, k)                       # (B, T, k)
    routes = experts if valid is None else jnp.where(valid[..., None], experts, -1)
    dt = cfg.compute_dtype

    def expert_fn(w, rows, groups):
        h = nn.gelu(dispatch_lib.grouped_matmul(rows, w["wi"], groups))
        return dispatch_lib.grouped_matmul(h, w["wo"], groups)

    y = dispatch_lib.dropless(x.reshape(B * T, d), routes.reshape(B * T, k),
                              gates.reshape(B * T, k), E, expert_fn,
                              expert_params={"wi": wi.astype(dt), "wo": wo.astype(dt)}
                              ).reshape(B, T, -1)
    # routes per (example, route), the no-op route included; invalid tokens count nowhere
    per_example = jnp.zeros((B, R + 1), jnp.float32).at[
        jnp.arange(B)[:, None, None], jnp.where(routes < 0, R, routes)].add(1.0)[:, :R]
    counts = jnp.zeros((B, R), jnp.float32).at[jnp.arange(B)[:, None, None], experts].add(1.0)
    aux = {"load_balance": cfg.moe.load_balance_loss_weight * R * jnp.sum(
        counts.sum(0) / (k * B * T) * probs.mean((0, 1)))}
    real = (routes >= 0) & (routes < E)
    stats = {"dropped": jnp.zeros((), jnp.float32),
             "noop": per_example[:, E:].sum() / (B * T) if R > E else jnp.zeros(()),
             "load": per_example[:, :E].mean(0) / T, "ffn_ran": real.any(-1)}
    return constrain(y, TOKENS), aux, stats


class MoeFfnPerToken(nn.Module):
    """MoeFfn's parameters and arithmetic for tokens decoded one at a time (B, 1, d): each
    token goes to its top-k experts (a no-op route adds nothing) with its routing
    probabilities as weights. ``counts`` (B, E) are the routes each expert has kept so far
    in the sequence: a route to a full expert (``capacity``) is dropped, exactly as the
    sequence form with ``moe_priority="position"`` drops it (token-choice routing only:
    expert choice ranks the whole sequence and has no causal form). Only rows with
    ``write`` True count. Returns (y, counts)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x, counts, capacity, write):
        cfg = self.cfg
        E, dt = cfg.moe.num_experts, cfg.compute_dtype
        logits = router_layer(cfg)(x[:, 0].astype(jnp.float32))
        gates, experts = jax.lax.top_k(jax.nn.softmax(logits, axis=-1),
                                       cfg.moe.num_experts_per_tok)           # (B, k)
        real = experts < E                                                   # no-op route
        experts = jnp.minimum(experts, E - 1)
        kept = real & (jnp.take_along_axis(counts, experts, 1) < capacity)
        gates = jnp.where(kept, gates, 0.0)
        counts = counts + jnp.sum(jax.nn.one_hot(experts, E, dtype=counts.dtype)
                                  * (kept & write[:, None])[..., None], axis=1)
        wi, wo = expert_kernels(self, cfg, x.shape[-1])
        hidden = nn.gelu(jnp.einsum("bd,bkdf->bkf", x[:, 0], wi[experts].astype(dt)))
        y = jnp.einsum("bkf,bkfd->bkd", hidden, wo[experts].astype(dt))
        return jnp.einsum("bk,bkd->bd", gates.astype(dt), y)[:, None], counts


def attention_then_moe(cfg: ModelConfig, h, positions, given=None, **moe_args):
    """The core's attention, then the MoE FFN: ``(a, m, probs, aux, stats)``; ``moe_args``
    go to ``MoeFfn`` (valid, capacity).

    Call it inside a compact method: its submodules ("attn", "attn_norm", "mlp_norm", "moe")
    belong to the caller, so the MoE layer and staged MoDE's block (``dynjax.models.mod``)
    share one definition and one parameter layout.
    """
    a, _ = Attention(cfg, name="attn")(norm("attn_norm", cfg)(h), positions)
    m, probs, aux, stats = MoeFfn(cfg, name="moe")(norm("mlp_norm", cfg)(h + a), given,
                                                   **moe_args)
    return a, m, probs, aux, stats


class MoeLayer(nn.Module):
    """Attention then the MoE FFN. Carry (h, positions); xs: the layer's Given or None."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, carry, given):
        h, positions = carry
        a, m, probs, aux, stats = attention_then_moe(self.cfg, h, positions, given)
        return (h + a + m, positions), (probs, aux, stats)


class MoeDecoder(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens, given=None):
        """``given``: a :class:`~dynjax.coeffs.Given` of ``{"router": ...}`` or None."""
        cfg = self.cfg
        h, positions = embed_tokens(cfg, tokens)
        xs = coeffs_lib.part(given, lambda v: v["router"], cfg.n_layers)
        (h, _), (probs, aux, stats) = scan_layers(MoeLayer, cfg, cfg.n_layers)((h, positions), xs)
        sow_routing(self, aux, "moe_stats", stats)
        return Head(cfg, name="head")(h), {"router": probs}


def sow_routing(module: nn.Module, aux: dict, collection: str, stats) -> None:
    """A routed decoder's side outputs: each auxiliary loss (already weighted, one value per
    routed layer) as its mean over layers into ``aux_loss``, which training adds to the loss,
    and the per-layer routing statistics into ``collection``."""
    for name, value in aux.items():
        module.sow("aux_loss", name, value.mean())
    module.sow(collection, "stats", stats)

