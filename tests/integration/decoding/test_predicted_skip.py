"""Predicted skipping (dynjax.decoding.predicted_skip): a block runs on exactly the tokens its predictor
selects; all selected is the model's forward, none selected removes every update; decoding
token by token equals the window's pass (whole-model decoding: the integration tier). The
post-hoc fit, a training run, learns its target: test_predicted_skip_fit.py beside this file."""
import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax.decoding import predicted_skip
from dynjax.models import build, mod
from dynjax.models.transformer import ModelConfig
from tests.conftest import perturbed

B, T = 2, 12
CFG = ModelConfig(family="gates", variant="feature_gate", d_model=32, n_heads=2, n_layers=2,
                  d_ff=64, scan_layers=False)
TOKENS = jax.random.randint(jax.random.key(0), (B, T), 0, 256)


def noisy(params, seed):
    """Parameters plus noise: the zero-initialised controller then varies with the input."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(tree, [a + 0.3 * jax.random.normal(k, a.shape, a.dtype)
                                     for a, k in zip(leaves, keys)])


@functools.partial(jax.jit, static_argnums=(0,))
def predictors(n_layers, bias=0.0, seed=3):
    """Stacked random predictors; ``bias`` added to every output logit (one program, not
    the initialisation op by op)."""
    net = mod.Predictor(8)
    p = jax.vmap(lambda k: nn.meta.unbox(net.init(k, jnp.zeros((1, 1, CFG.d_model)))["params"]))(
        jax.random.split(jax.random.key(seed), n_layers))
    p = noisy(p, seed + 1)
    return dict(p, out=dict(p["out"], bias=p["out"]["bias"] + bias))


@pytest.fixture(scope="module")
def fg():
    model = build(CFG)
    return model, perturbed(model.init(jax.random.key(1), TOKENS), seed=2, scale=0.3)


def test_everything_predicted_is_the_plain_forward_and_nothing_removes_every_update(fg):
    model, params = fg
    plain, coeffs = jax.jit(model.apply)(params, TOKENS)
    run = jax.jit(lambda pr: predicted_skip.forward(CFG, params, pr, TOKENS))
    every, info = run(None)
    chex.assert_trees_all_close(every, plain, atol=2e-5, rtol=1e-5)
    chex.assert_trees_all_close(info["gate"], coeffs["gate"], atol=2e-6)
    assert info["entered"].all()
    none, info = run(predictors(CFG.n_layers, bias=-1e4))
    removed = jax.jit(model.apply)(params, TOKENS, {"gate": jnp.zeros_like(coeffs["gate"])})[0]
    assert not info["entered"].any()
    chex.assert_trees_all_close(none, removed, atol=1e-5, rtol=1e-6)
    assert np.abs(np.asarray(none - plain)).max() > 1e-2


def test_a_block_runs_on_exactly_the_predicted_tokens_up_to_its_slots():
    cfg = CFG.replace(n_layers=1)
    model = build(cfg)
    params = perturbed(model.init(jax.random.key(1), TOKENS), seed=2, scale=0.3)
    pred = predictors(1)
    emb = params["embed"]["embedding"][TOKENS]
    want = np.asarray(mod.Predictor(8).apply({"params": jax.tree.map(lambda a: a[0], pred)},
                                             emb) > 0)
    assert 0 < want.sum() < want.size
    removed = jax.jit(model.apply)(params, TOKENS, {"gate": jnp.zeros((1, B, T))})[0]
    changed_rows = lambda lg: np.abs(np.asarray(lg - removed)).max(-1) > 1e-4  # not rounding
    logits, info = jax.jit(lambda: predicted_skip.forward(cfg, params, pred, TOKENS))()
    np.testing.assert_array_equal(info["entered"][0], want)
    np.testing.assert_array_equal(changed_rows(logits), want)  # only the predicted tokens' updates
    assert np.all(np.asarray(info["gate"][0])[~want] == 0)
    # A capacity of 3 slots: the first 3 askers of each sequence run, later ones skip.
    logits3, info3 = jax.jit(lambda: predicted_skip.forward(cfg, params, pred, TOKENS, slots=[3]))()
    first3 = want & (np.cumsum(want, axis=1) <= 3)
    np.testing.assert_array_equal(info3["entered"][0], first3)
    np.testing.assert_array_equal(changed_rows(logits3), first3)
    np.testing.assert_array_equal(info3["asked"][0], want)


def test_decoding_token_by_token_equals_the_window_pass(fg):
    _, params = fg
    pred = predictors(CFG.n_layers)
    for slots in ([5, 7],):  # block 0 binds: later askers overflow
        full, info = jax.jit(lambda: predicted_skip.forward(CFG, params, pred, TOKENS, slots))()
        step, sinfo = jax.jit(lambda: predicted_skip.cached_forward(CFG, params, pred, TOKENS, slots))()
        entered = np.asarray(info["entered"])
        assert 0 < entered.sum() < entered.size
        np.testing.assert_array_equal(sinfo["entered"], entered)
        chex.assert_trees_all_close(step, full, atol=2e-5, rtol=1e-5)
        chex.assert_trees_all_close(sinfo["gate"], info["gate"], atol=2e-6)
