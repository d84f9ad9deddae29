"""Mixture-of-Depths: routing, positions, replay, capacity errors, causal decoding, KV cache.
The predictor's causal route and greedy generation against re-decoding every prefix:
tests/integration/models/test_mod_sweep.py."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import chex
import numpy as np
import pytest

from dynjax import decoding
from dynjax.coeffs import replaying
from dynjax.decoding.cache import CachedBlock
from dynjax.measure import routing
from dynjax.models import build, mod
from dynjax.models.transformer import Block, ModelConfig, next_token_nll, token_positions
from tests.conftest import normal

B, T, D = 2, 16, 32
CFG = ModelConfig(family="mod", variant="mod", d_model=D, n_heads=2, n_layers=2, d_ff=64,
                  scan_layers=False).replace(mod_capacity=0.25)
K = 4  # floor(0.25 * 16)


@pytest.fixture(scope="module")
def layer():
    """One MoD layer (raw router weight), its params, an input h and positions."""
    cfg = CFG.replace(mod_router_weight="raw")
    h = normal(0, (B, T, D))
    pos = token_positions(cfg, jnp.broadcast_to(jnp.arange(T), (B, T)))
    module = mod.ModLayer(cfg, True)
    params = nn.meta.unbox(module.init(jax.random.key(1), h, pos, None))
    run = jax.jit(lambda h, scores: module.apply(params, h, pos, replaying({"router": scores}))[0])
    block = lambda x, p: Block(cfg).apply({"params": params["params"]["block"]}, x,
                                          token_positions(cfg, p))[0]
    return run, block, h, pos


def scores_for(selected):
    """Router scores that pick ``selected`` tokens (per example) with weights 1.5, 1.6, ..."""
    s = np.full((B, T), -5.0, np.float32)
    for b in range(B):
        s[b, selected[b]] = 1.5 + 0.1 * np.arange(len(selected[b]))
    return jnp.asarray(s)


SEL = [np.array([1, 4, 9, 13]), np.array([0, 2, 3, 15])]


def test_unselected_tokens_bitwise_unchanged(layer):
    run, _, h, _ = layer
    out = np.asarray(run(h, scores_for(SEL)))
    for b in range(B):
        unsel = np.setdiff1d(np.arange(T), SEL[b])
        np.testing.assert_array_equal(out[b, unsel], np.asarray(h)[b, unsel])
        assert not np.any(np.all(out[b, SEL[b]] == np.asarray(h)[b, SEL[b]], axis=-1))


def test_router_weight_multiplies_only_the_update_at_original_positions(layer):
    run, block, h, pos = layer
    s = scores_for(SEL)
    d1 = np.asarray(run(h, s) - h)
    d2 = np.asarray(run(h, 2 * s) - h)  # same selection, twice the raw weight
    np.testing.assert_allclose(d2, 2 * d1, rtol=1e-5, atol=1e-6)
    # The update is the block on the gathered tokens at their ORIGINAL positions.
    idx = jnp.asarray(np.stack(SEL))
    x = jnp.take_along_axis(h, idx[..., None], 1)
    w = jnp.take_along_axis(s, idx, 1)[..., None]
    expect = x + w * block(x, idx)
    got = jnp.take_along_axis(run(h, s), idx[..., None], 1)
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5)
    renumbered = x + w * block(x, jnp.broadcast_to(jnp.arange(K), (B, K)))
    assert np.abs(np.asarray(got - renumbered)).max() > 1e-3


def test_selected_token_attends_only_to_selected_tokens_at_or_before_it(layer):
    run, _, h, _ = layer
    s = scores_for(SEL)
    base = np.asarray(run(h, s))
    b, sel = 0, SEL[0]
    bump = lambda t: h.at[b, t].add(1.0)
    # An unselected token is invisible to every selected one.
    out = np.asarray(run(bump(6), s))
    np.testing.assert_allclose(out[b, sel], base[b, sel], atol=1e-6)
    # A selected token at position 9 affects selected tokens at 9 and 13, not 1 and 4.
    out = np.asarray(run(bump(9), s))
    np.testing.assert_allclose(out[b, [1, 4]], base[b, [1, 4]], atol=1e-6)
    assert np.abs(out[b, 13] - base[b, 13]).max() > 1e-4


@pytest.fixture(scope="module")
def model():
    m = build(CFG)
    tokens = jax.random.randint(jax.random.key(2), (B, T), 0, 256)
    return m, m.init(jax.random.key(3), tokens), tokens


def test_bitwise_replay_and_one_compilation(model):
    m, params, tokens = model
    traces = []

    @jax.jit
    def f(params, tokens, coeffs=None):
        traces.append(1)
        return m.apply(params, tokens, coeffs)

    logits, coeffs = f(params, tokens)
    assert coeffs["router"].shape == (1, B, T)
    np.testing.assert_array_equal(f(params, tokens, coeffs)[0], logits)
    f(params, (tokens + 7) % 256)
    f(params, tokens[::-1])
    assert len(traces) == 2  # record and replay; other inputs of the shape reuse them
    # Replayed scores decide: another example's scores change the assignment.
    swapped = {"router": coeffs["router"][:, ::-1]}
    assert np.abs(np.asarray(f(params, tokens, swapped)[0] - logits)).max() > 1e-4


def test_full_capacity_with_unit_weight_equals_dense():
    cfg = CFG.replace(mod_capacity=1.0, mod_router_weight="raw")
    m, dense = build(cfg), build(cfg.replace(variant="dense"))
    tokens = jax.random.randint(jax.random.key(4), (B, T), 0, 256)
    params = m.init(jax.random.key(5), tokens)
    dense_params = jax.tree.map(lambda a: a, params)
    del dense_params["layers"]["layer_0"]["sub_1"]["router"]
    del dense_params["layers"]["layer_0"]["sub_1"]["predictor"]
    ones = {"router": jnp.ones((1, B, T))}
    got = jax.jit(m.apply)(params, tokens, ones)[0]
    want = jax.jit(dense.apply)(dense_params, tokens)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("c", [0.0, -0.5, 1.5])
def test_capacity_outside_unit_interval_is_a_clear_error(c):
    with pytest.raises(ValueError, match="mod_capacity"):
        build(CFG.replace(mod_capacity=c))


def test_zero_capacity_tokens_is_a_clear_error():
    m = build(CFG.replace(mod_capacity=0.1))
    with pytest.raises(ValueError, match=r"floor\(0.1 \* 8\) = 0"):
        m.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))


def assert_causal_at_every_split(logits_fn, tokens, atol=1e-6):
    """Changing tokens from position s on leaves the logits before s unchanged, for every s."""
    logits = np.asarray(logits_fn(tokens))
    for s in range(1, tokens.shape[1]):
        changed = tokens.at[:, s:].set((tokens[:, s:] + 1 + s) % 256)
        np.testing.assert_allclose(np.asarray(logits_fn(changed))[:, :s], logits[:, :s],
                                   atol=atol, err_msg=f"split at {s}")


ROUTES = ["router", "predictor"]


def check_causal_at_every_split_and_top_k_is_not(model, route):
    """The causal ``route`` is causal at every split; the training route (top-k) fails the
    same check. Returns the route's config, model and jitted forward."""
    m, params, tokens = model
    cfg = mod.decode_config(CFG, route)
    dm = build(cfg)
    full = jax.jit(lambda t: dm.apply(params, t)[0])
    assert_causal_at_every_split(full, tokens)
    with pytest.raises(AssertionError):
        assert_causal_at_every_split(jax.jit(lambda t: m.apply(params, t)[0]), tokens)
    return cfg, dm, full


def check_causal_routing_is_causal_at_every_split_and_kv_cache_matches_it(model, route):
    """The causal route is causal at every split (top-k is not), and the KV-cache decoder,
    a longer cache and the masked branch all equal it."""
    _, params, tokens = model
    cfg, dm, full = check_causal_at_every_split_and_top_k_is_not(model, route)
    stats = routing.routing_stats(dm, params, tokens)
    entered = np.asarray(stats["entered"])
    assert 0 < entered.mean() < 1                      # a real mix, no slot budget binding
    assert not np.asarray(stats["overflow"]).any()
    logits = full(tokens)
    cached, info_c = jax.jit(lambda t: decoding.cached_forward(cfg, params, t))(tokens)
    entered_c = info_c["entered"]
    np.testing.assert_allclose(cached, logits, atol=1e-4, rtol=1e-4)
    np.testing.assert_array_equal(entered_c, entered)
    # A longer cache (a longer generation) changes nothing for the prefix.
    longer, _ = jax.jit(lambda t: decoding.cached_forward(cfg, params, t, max_len=4 * T))(tokens)
    np.testing.assert_allclose(longer, cached, atol=1e-6)
    # Always running the block and masking its result is the same computation as skipping it.
    masked, info_m = jax.jit(lambda t: decoding.cached_forward(cfg, params, t, "masked"))(tokens)
    entered_m = info_m["entered"]
    np.testing.assert_allclose(masked, cached, atol=1e-6)
    np.testing.assert_array_equal(entered_m, entered_c)
    with pytest.raises(ValueError, match="branch='maybe'"):
        decoding.cached_forward(cfg, params, tokens, "maybe")


def test_causal_route_is_causal_at_every_split_and_top_k_is_not(model):
    """The inner loop's guard; the KV-cache decoder's agreement with it, for both causal
    routes, is tests/integration/models/test_mod_sweep.py's."""
    check_causal_at_every_split_and_top_k_is_not(model, "router")


def test_routing_report_counts_precision_and_recall(model):
    m, params, tokens = model
    got = routing.classification([1, 1, 0, 0, 1, 0, 0, 0], [1, 0, 1, 0, 0, 0, 0, 0])
    assert got == {"precision": 1 / 3, "recall": 0.5, "f1": 0.4, "accuracy": 5 / 8,
                   "predicted_rate": 3 / 8}
    rep = routing.routing_report(m, params, tokens)
    assert rep["base_rate"] == K / T and rep["never_route_accuracy"] == 1 - K / T
    for rule in ("router", "predictor"):
        r = rep[rule]["on_topk_forward"]
        assert 0 <= r["precision"] <= 1 and 0 <= r["recall"] <= 1 and len(rep[rule]["per_block"]) == 1
        assert rep[rule]["overflow_fraction"] == 0.0


def test_language_model_loss_alone_trains_the_router_not_the_predictor(model):
    """With both BCE weights 0, the router still learns through its sigmoid weight on the
    update, and the stop-gradient predictor gets no gradient at all."""
    _, params, tokens = model
    cfg = CFG.replace(mod_bce_weight=0.0, mod_predictor_weight=0.0)
    m = build(cfg)

    def loss(p):
        logits, _, aux = m.apply(p, tokens, with_aux=True)
        return next_token_nll(logits, tokens).mean() + sum(aux.values())

    sub = jax.jit(jax.grad(loss))(params)["layers"]["layer_0"]["sub_1"]
    assert np.abs(np.asarray(sub["router"]["proj"]["kernel"])).max() > 1e-6
    chex.assert_trees_all_equal(sub["predictor"], jax.tree.map(jnp.zeros_like, sub["predictor"]))


def test_aux_losses_train_router_and_predictor_only_through_their_targets(model):
    m, params, tokens = model
    _, _, aux = jax.jit(lambda p: m.apply(p, tokens, with_aux=True))(params)
    assert set(aux) == {"router_bce", "predictor_bce"}
    grads = jax.jit(jax.grad(lambda p: m.apply(p, tokens, with_aux=True)[2]["predictor_bce"]))(
        params)
    sub = grads["layers"]["layer_0"]
    assert np.abs(np.asarray(sub["sub_1"]["predictor"]["out"]["kernel"])).max() > 0
    assert all(np.all(np.asarray(g) == 0) for g in jax.tree.leaves(sub["sub_0"]))


def block_runs(cfg, params, tokens, branch):
    """How many times a decode step executed a block (dense and MoD), counted on the host
    by a callback that the real ``CachedBlock`` call carries: it fires only when the
    compiled program runs the block, not when it is traced."""
    runs = []

    def count(next_fun, args, kwargs, context):
        if isinstance(context.module, CachedBlock) and context.method_name == "__call__":
            jax.debug.callback(lambda: runs.append(1))
        return next_fun(*args, **kwargs)
    with nn.intercept_methods(count):
        _, info = jax.jit(lambda t: decoding.cached_forward(cfg, params, t, branch))(tokens)
    jax.effects_barrier()
    return len(runs), np.asarray(info["entered"])


@pytest.mark.parametrize("batch", [1, B])
def test_a_skipped_mod_block_does_not_run(model, batch):
    """branch="cond": a MoD block executes in a decode step only when some token of the
    batch enters it (the dense block every step); "masked" runs it every step."""
    _, params, tokens = model
    cfg = mod.decode_config(CFG, "router")
    runs, entered = block_runs(cfg, params, tokens[:batch], "cond")
    n_dense = CFG.n_layers - len(mod.mod_layer_ids(CFG))
    stepped = np.any(entered, axis=1)                  # (MoD blocks, T): someone entered
    assert 0 < stepped.mean() < 1                      # real skips and real entries
    assert runs == n_dense * T + stepped.sum()
    masked, _ = block_runs(cfg, params, tokens[:batch], "masked")
    assert masked == CFG.n_layers * T
