"""Mixture-of-Experts feed-forward blocks with fixed expert capacity, and integrated MoDE.

Every block is ``h + a + MoE(norm(h + a))``: the core's attention, then E expert MLPs of
which each token reaches at most k (token choice or expert choice, static shapes, GShard's
one-hot buffers; a token past an expert's capacity is dropped), with the Switch
load-balancing and ST-MoE z auxiliary losses. Integrated MoDE adds a no-op expert;
``moe_dispatch`` "dropless" / "dense" compute the same without drops. Coefficients: the
router probabilities; replay recomputes selection, capacity and weights from them.
Depth: docs/moe.md#the-moe-familys-blocks-dynjaxmodelsmoepy
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from dynjax import coeffs as coeffs_lib
from dynjax.coeffs import Axes
from dynjax.models import moe_ffn
from dynjax.models.components.experts import EXPERTS
from dynjax.models.moe_ffn import expert_choice, token_choice  # noqa: F401  (callers' names)
from dynjax.models.transformer import (Attention, Head, ModelConfig, dense_init, embed_tokens, norm,
                                       scan_layers)

VARIANTS = ("moe", "mode_integrated")
DISPATCHES = moe_ffn.DISPATCHES
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
                         "buffers), 'dropless' (sort by expert) or 'dense' (every expert)")
    if dropless(cfg) and cfg.moe.routing != "token_choice":
        raise ValueError(f"model.moe_dispatch={cfg.moe.dispatch!r} needs moe_routing="
                         "'token_choice' (expert choice has capacity by definition)")
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


def eval_routes(cfg: ModelConfig) -> dict:
    """name -> (config, causal?): the sequence form, and token-order buffers beside it when
    the sequence form is not causal."""
    routes = {"sequence": (cfg, is_causal(cfg))}
    if not is_causal(cfg) and cfg.moe.routing == "token_choice":
        routes["position"] = (cfg.replace(moe_priority="position"), True)
    return routes


def dropless(cfg: ModelConfig) -> bool:
    """No capacity: every route is computed ("dropless" or "dense" dispatch)."""
    return cfg.moe.dispatch != "onehot"


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
    """x (B, T, d) -> (y, probs, aux, stats) through ``moe_ffn.moe_ffn`` with GELU experts.
    The router always runs; ``given`` (a :class:`~dynjax.coeffs.Given` of the probabilities,
    or None) decides which are used."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x, given=None, valid=None, capacity=None):
        """``valid`` (B, T): tokens that may take buffer slots (all when None); ``capacity``:
        the expert buffer size (default ``expert_capacity(cfg, T)``)."""
        cfg = self.cfg
        T, d = x.shape[1:]
        logits = router_layer(cfg)(x.astype(jnp.float32))
        probs = coeffs_lib.site(jax.nn.softmax(logits, axis=-1), given)
        aux = {"router_z": moe_ffn.router_z(logits, cfg.moe.router_z_loss_weight)}
        experts = weights = None
        if cfg.moe.routing == "token_choice":
            weights, experts = jax.lax.top_k(probs, cfg.moe.num_experts_per_tok)
            aux["load_balance"] = moe_ffn.load_balance(probs, experts,
                                                       cfg.moe.load_balance_loss_weight)
        wi, wo = expert_kernels(self, cfg, d)
        y, stats = moe_ffn.moe_ffn(
            x, probs, experts, weights, {"wi": wi, "wo": wo}, kind=EXPERTS["gelu"](),
            num_experts=cfg.moe.num_experts, dispatch=cfg.moe.dispatch,
            capacity=expert_capacity(cfg, T) if capacity is None else capacity,
            by_position=cfg.moe.priority == "position", valid=valid, dtype=cfg.compute_dtype)
        return y, probs, aux, stats


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

