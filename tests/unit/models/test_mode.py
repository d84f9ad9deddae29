"""Staged MoDE (MoD routing around an MoE block): bitwise replay of both routings, unselected
tokens untouched, the k slots' MoE routing replayed verbatim. The second causal capacity
case and the mode_tiny configs' train step: tests/integration/models/test_mode_sweep.py."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax import decoding
from dynjax.coeffs import replaying
from dynjax.measure import routing
from dynjax.models import build, mod
from tests.unit.models.test_mod import assert_causal_at_every_split
from dynjax.models.transformer import ModelConfig, token_positions
from tests.conftest import normal

B, T, D, E = 2, 16, 32, 4
K = 4  # floor(0.25 * 16)
CFG = ModelConfig(family="mod", variant="mode_staged", d_model=D, n_heads=2, n_layers=2,
                  d_ff=64, scan_layers=False).replace(mod_capacity=0.25, moe_num_experts=E,
                                                      moe_capacity_factor=1.0)
TOKENS = jax.random.randint(jax.random.key(0), (B, T), 0, 256)


def test_record_replay_bitwise_with_both_routings():
    model = build(CFG.replace(scan_layers=True, n_layers=4))   # 2 scanned groups
    params = model.init(jax.random.key(1), TOKENS)
    fwd = jax.jit(model.apply)
    logits, coeffs = fwd(params, TOKENS)
    assert set(coeffs) == {"router", "moe"} and set(model.schema) == {"router", "moe"}
    assert coeffs["router"].shape == (2, B, T)          # blocks 1 and 3 are MoD blocks
    assert coeffs["moe"].shape == (2, B, K, E)          # routing of the k slots
    np.testing.assert_allclose(coeffs["moe"].sum(-1), 1, rtol=1e-5)
    logits2, coeffs2 = fwd(params, TOKENS, coeffs)
    np.testing.assert_array_equal(np.asarray(logits2), np.asarray(logits))
    np.testing.assert_array_equal(np.asarray(coeffs2["moe"]), np.asarray(coeffs["moe"]))
    # The MoE routing inside the block is replayed, not recomputed: swapping the slots'
    # routing values changes the output.
    swapped = dict(coeffs, moe=coeffs["moe"][:, :, ::-1])
    assert not np.array_equal(np.asarray(fwd(params, TOKENS, swapped)[0]), np.asarray(logits))


def test_unselected_tokens_bitwise_unchanged():
    h = normal(2, (B, T, D))
    pos = token_positions(CFG, jnp.broadcast_to(jnp.arange(T), (B, T)))
    layer = mod.ModLayer(CFG, True)
    params = nn.meta.unbox(layer.init(jax.random.key(3), h, pos, None))
    assert "moe" in params["params"]["block"]          # the routed block's FFN is the MoE
    sel = [np.array([1, 4, 9, 13]), np.array([0, 2, 3, 15])]
    scores = np.full((B, T), -5.0, np.float32)
    for b in range(B):
        scores[b, sel[b]] = 1.0 + 0.1 * np.arange(K)
    moe = jax.nn.softmax(normal(4, (B, K, E)), axis=-1)
    run = jax.jit(lambda s: layer.apply(params, h, pos, replaying({"router": s, "moe": moe})))
    out, (coeffs, aux, stats) = run(jnp.asarray(scores))
    out, hn = np.asarray(out), np.asarray(h)
    for b in range(B):
        unsel = np.setdiff1d(np.arange(T), sel[b])
        np.testing.assert_array_equal(out[b, unsel], hn[b, unsel])
        assert not np.any(np.all(out[b, sel[b]] == hn[b, sel[b]], axis=-1))
    np.testing.assert_array_equal(np.asarray(stats["entered"]).sum(-1), [K, K])
    assert coeffs["moe"].shape == (B, K, E) and {"load_balance", "router_z"} <= set(aux)


CAUSAL = [("router", 1, 1.0), ("router", 2, 0.5)]    # (route, top_k, capacity factor)


def check_causal_staged_mode_with_binding_expert_capacity(route, top_k, cf):
    """A slot budget of 8 and expert buffers of ceil(cf * top_k * 8 / 4): the causal forward
    is causal at every split, tokens that did not enter take no expert slot, routes really
    drop (second choices queue in token order), and the KV-cache decoder equals it."""
    cfg = mod.decode_config(CFG, route).replace(mod_decode_slots=8,
                              moe_num_experts_per_tok=top_k, moe_capacity_factor=cf)
    model = build(cfg)
    params = model.init(jax.random.key(1), TOKENS)
    full = jax.jit(lambda t: model.apply(params, t)[0])
    assert_causal_at_every_split(full, TOKENS)
    stats = routing.routing_stats(model, params, TOKENS)
    assert float(np.mean(stats["moe_dropped"])) > 0          # the capacity binds
    entered = np.asarray(stats["entered"])
    assert 0 < entered.mean() < 1
    # Expert load counts only the tokens that entered: at most capacity per expert.
    slots = mod.decode_slots(cfg, T)                         # the MoE sees 8 slots
    load = np.asarray(stats["moe_load"]) * slots             # routes per expert, mean over B
    assert load.max() <= mod.causal_expert_capacity(cfg, slots) + 1e-6
    assert load.sum() == pytest.approx(entered.sum() / B * top_k * (1 - float(
        np.mean(stats["moe_dropped"]))), rel=1e-5)          # only entering tokens hold slots
    cached, info_c = jax.jit(lambda t: decoding.cached_forward(cfg, params, t))(TOKENS)
    entered_c = info_c["entered"]
    np.testing.assert_allclose(cached, full(TOKENS), atol=1e-4, rtol=1e-4)
    np.testing.assert_array_equal(entered_c, entered)
    # The experts matter: zeroing their output weights changes the cached logits.
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    zeroed = jax.tree_util.tree_unflatten(jax.tree.structure(params), [
        jnp.zeros_like(a) if jax.tree_util.keystr(k).endswith("['wo']") else a
        for k, a in flat])
    assert not np.allclose(jax.jit(lambda p: decoding.cached_forward(cfg, p, TOKENS)[0])(zeroed),
                           cached)


def test_causal_staged_mode_needs_position_priority():
    cfg = CFG.replace(mod_route="router", moe_num_experts_per_tok=2)
    with pytest.raises(ValueError, match="moe_priority='position'"):
        build(cfg)
    build(mod.decode_config(cfg))  # decode_config sets it


def test_expert_choice_decoding_is_refused_clearly():
    with pytest.raises(NotImplementedError, match="expert_choice ranks the whole sequence"):
        decoding.init_cache(CFG.replace(moe_routing="expert_choice"), B, T)
