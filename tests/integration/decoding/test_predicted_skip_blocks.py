"""Predicted-skip decoding on a whole model (tests/unit/decoding/test_predicted_skip.py holds
the token-by-token check): a block runs on exactly the predicted tokens up to its slots; everything
predicted is the plain forward."""
import chex
import jax
import jax.numpy as jnp
import numpy as np

from dynjax.decoding import predicted_skip
from dynjax.models import build, mod
from tests.unit.decoding.test_predicted_skip import (  # noqa: F401 (fg: a fixture)
    B, CFG, T, TOKENS, fg, noisy, predictors)


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
    params = jax.jit(lambda: noisy(model.init(jax.random.key(1), TOKENS), 2))()
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
