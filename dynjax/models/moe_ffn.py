"""One Mixture-of-Experts FFN for every routed family (``moe``, integrated MoDE, ``llm``).

A caller computes its router's scores (the recorded coefficient) and picks each token's
experts by its own rule; :func:`moe_ffn` dispatches the tokens (``DISPATCHES``), runs the
expert MLP kind (``components.experts.EXPERTS``: gelu, swiglu, clamped_swiglu) and
combines. :func:`load_balance` and :func:`router_z` are the one pair of auxiliary losses.
Routes at or past ``num_experts`` (integrated MoDE's no-op expert) and negative ones
(tokens that did not enter) compute nothing. The forms side by side: docs/moe.md.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dynjax.models import dispatch as dispatch_lib
from dynjax.models.activation_sharding import BUFFER_HIDDEN, BUFFERS, TOKENS, constrain

F32 = jnp.float32
# "onehot": GShard buffers of a fixed capacity (routes past it drop); "dropless": sorted by
# expert, a grouped matmul, nothing dropped; "dense": every expert on every token (E/k x)
DISPATCHES = ("onehot", "dropless", "dense")


def load_balance(probs, experts, weight=1.0):
    """Switch's load-balancing loss ``weight * R * sum_e f_e P_e`` over the R routes of
    ``probs`` (.., R) (1 when balanced): f_e the share of the (token, choice) routes in
    ``experts`` (.., k) that picked e, P_e the mean probability. Routes carry no gradient."""
    R = probs.shape[-1]
    share = jax.nn.one_hot(experts, R, dtype=F32).mean(axis=tuple(range(experts.ndim)))
    return weight * R * jnp.sum(share * probs.mean(axis=tuple(range(probs.ndim - 1))))


def router_z(logits, weight=1.0):
    """ST-MoE's router z-loss ``weight * mean(logsumexp(logits)^2)``."""
    return weight * jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)


def token_choice(probs, k, capacity, valid=None, by_position=False):
    """Top-k routes per token -> (dispatch, combine), both (B, T, R, C), and kept (B, T, k)."""
    gates, experts = jax.lax.top_k(probs, k)
    return routes_to_buffers(experts, gates, probs.shape[-1], capacity, valid, by_position)


def routes_to_buffers(experts, gates, R, capacity, valid=None, by_position=False):
    """Chosen routes (B, T, k) and their weights -> (dispatch, combine), both (B, T, R, C),
    and kept (B, T, k). Tokens with ``valid`` False take no buffer slot; ``by_position``:
    token-order priority (causal), else GShard's (every first choice before any second)."""
    B, T, k = experts.shape
    choice = jax.nn.one_hot(experts, R, dtype=jnp.int32)           # (B, T, k, R)
    if valid is not None:
        choice = choice * valid[:, :, None, None]
    if by_position:   # a token's k choices are distinct experts: no order among them
        pos = (jnp.cumsum(choice.reshape(B, T * k, R), axis=1) - 1).reshape(B, T, k, R)
    else:             # GShard: every first choice before any second choice
        by_rank = jnp.swapaxes(choice, 1, 2).reshape(B, k * T, R)
        pos = (jnp.cumsum(by_rank, axis=1) - 1).reshape(B, k, T, R).swapaxes(1, 2)
    kept = choice * (pos < capacity)                               # (B, T, k, R)
    slot = jax.nn.one_hot(pos, capacity) * kept[..., None]         # (B, T, k, R, C)
    return slot.sum(2), (slot * gates[..., None, None]).sum(2), kept.sum(-1)


def expert_choice(probs, capacity):
    """Each expert takes its top-C tokens -> (dispatch, combine), both (B, T, E, C)."""
    T = probs.shape[1]
    gates, tokens = jax.lax.top_k(jnp.swapaxes(probs, 1, 2), capacity)   # (B, E, C)
    dispatch = jnp.moveaxis(jax.nn.one_hot(tokens, T), -1, 1)             # (B, T, E, C)
    return dispatch, dispatch * gates[:, None]


def uses_dense_form(dispatch: str, n_pairs: int, n_tokens: int, num_experts: int) -> bool:
    """Do ``n_tokens`` tokens run every expert? "dense" always; "dropless" too when its
    sorted rows (pairs plus a padding block per expert) would outnumber the dense form's
    (a few tokens: decoding), which is then the cheaper exact one."""
    return dispatch == "dense" or dispatch_lib.sorted_rows(n_pairs, num_experts) >= \
        n_tokens * num_experts


def tokens_ffn(x, experts, weights, w, kind, num_experts: int, dispatch: str, dt):
    """``sum_j weights_j MLP_{experts_j}(x)`` for tokens x (N, D), every route kept
    ("dropless" or "dense"; ``w`` the stacked expert weights in ``dt``)."""
    N, k = experts.shape
    E = num_experts
    if not uses_dense_form(dispatch, N * k, N, E):
        # each token's routes in expert order, so its k outputs are summed in the order
        # transformers adds them (its loop over experts; the dense form's too)
        order = jnp.argsort(experts, axis=-1)
        experts, weights = (jnp.take_along_axis(a, order, -1) for a in (experts, weights))
        return dispatch_lib.dropless(x, experts, weights.astype(dt), E, kind.grouped,
                                     expert_params=w)
    combine = jnp.sum(jax.nn.one_hot(experts, E, dtype=dt)
                      * weights.astype(dt)[..., None], axis=-2)             # (N, E)
    return jnp.einsum("ne,ned->nd", combine, kind.dense(w, x))


def moe_ffn(x, probs, experts, weights, params, *, kind, num_experts: int, dispatch: str,
            capacity: int, by_position=False, valid=None, dtype=F32):
    """x (B, T, d); ``probs`` (B, T, R) the router's scores after their site; ``experts``
    and ``weights`` (B, T, k) each token's routes (None: expert choice over ``probs``, one-hot
    only); ``params`` the stacked expert weights of ``kind`` (an EXPERTS instance).
    ``capacity``: the one-hot buffer per expert; ``valid`` (B, T): tokens that may route.
    Returns (y (B, T, d), stats: dropped, noop, load, ffn_ran)."""
    B, T, d = x.shape
    E, R = num_experts, probs.shape[-1]
    w = {n: a.astype(dtype) for n, a in params.items()}
    if dispatch != "onehot":
        k = experts.shape[-1]
        routes = experts if valid is None else jnp.where(valid[..., None], experts, -1)
        y = tokens_ffn(x.reshape(B * T, d), routes.reshape(B * T, k),
                       weights.reshape(B * T, k), w, kind, E, dispatch, dtype).reshape(B, T, -1)
        # routes per (example, route), the no-op route included; invalid tokens count nowhere
        per_example = jnp.zeros((B, R + 1), F32).at[
            jnp.arange(B)[:, None, None], jnp.where(routes < 0, R, routes)].add(1.0)[:, :R]
        real = (routes >= 0) & (routes < E)
        stats = {"dropped": jnp.zeros((), F32),
                 "noop": per_example[:, E:].sum() / (B * T) if R > E else jnp.zeros(()),
                 "load": per_example[:, :E].mean(0) / T, "ffn_ran": real.any(-1)}
        return constrain(y, TOKENS), stats
    if experts is None:
        dispatch_t, combine = expert_choice(probs, capacity)
        dropped = jnp.mean(dispatch_t.sum((2, 3)) == 0)
    else:
        k = experts.shape[-1]
        dispatch_t, combine, kept = routes_to_buffers(experts, weights, R, capacity, valid,
                                                      by_position)
        n_valid = k * (B * T if valid is None else jnp.maximum(valid.sum(), 1))
        dropped = 1.0 - kept.sum() / n_valid
    noop = dispatch_t[:, :, E:].sum((2, 3)).mean() if R > E else jnp.zeros(())
    dispatch_t, combine = dispatch_t[:, :, :E], combine[:, :, :E]  # the no-op expert: nothing
    xe = constrain(jnp.einsum("btec,btd->becd", dispatch_t.astype(dtype), x), BUFFERS)
    ye = constrain(kind.buffers(w, xe, lambda h: constrain(h, BUFFER_HIDDEN)), BUFFERS)
    y = constrain(jnp.einsum("btec,becd->btd", combine.astype(dtype), ye), TOKENS)
    stats = {"dropped": dropped, "noop": noop, "load": dispatch_t.sum((1, 3)).mean(0) / T,
             "ffn_ran": dispatch_t.sum((2, 3)) > 0}  # (B, T): some real expert took it
    return y, stats
