"""Predicted skipping (dynjax.decoding.predicted_skip): a block runs on exactly the tokens its predictor
selects; all selected is the model's forward, none selected removes every update; decoding
token by token equals the window's pass. The post-hoc fit, a training run, learns its target:
tests/integration/decoding/test_predicted_skip_fit.py."""
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
    return model, jax.jit(lambda: noisy(model.init(jax.random.key(1), TOKENS), 2))()


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
