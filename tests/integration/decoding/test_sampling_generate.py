"""Greedy and sampled generation on a tiny model (tests/unit/decoding/test_sampling.py holds
the masks and the sampled distribution): generate is the argmax continuation, streaming equals
generate."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax import decoding
from dynjax.decoding.sampling import Sampling
from dynjax.models import build
from tests.conftest import perturbed, tiny_config


@pytest.fixture(scope="module")
def tiny_lm():
    cfg = build(tiny_config("feature_gate", n_layers=2).model.to_dict()).cfg
    tokens = jax.random.randint(jax.random.key(3), (2, 6), 0, 256)
    params = build(cfg).init(jax.random.key(1), tokens)
    params = perturbed(params, seed=2, scale=0.3)
    return cfg, params, tokens


def test_greedy_generate_is_the_argmax_continuation(tiny_lm):
    cfg, params, prompt = tiny_lm
    out = jax.jit(decoding.generate, static_argnums=(0, 3))(cfg, params, prompt, 5)
    logits, _ = jax.jit(build(cfg).apply)(params, out)
    # every new token is the argmax of the forward at the position before it
    np.testing.assert_array_equal(np.asarray(out[:, 6:]),
                                  np.asarray(jnp.argmax(logits[:, 5:-1], -1)))


def test_stream_equals_generate_greedy_and_sampled(tiny_lm):
    cfg, params, prompt = tiny_lm
    gen = jax.jit(decoding.generate, static_argnums=(0, 3, 4))
    for sampling in (Sampling(), Sampling(1.0, top_k=50, top_p=0.9)):
        key = jax.random.key(7)
        streamed = jnp.stack(list(decoding.stream(cfg, params, prompt, 6, sampling, key)), 1)
        np.testing.assert_array_equal(np.asarray(streamed),
                                      np.asarray(gen(cfg, params, prompt, 6, sampling, key)[:, 6:]))
    a = gen(cfg, params, prompt, 6, Sampling(1.0), jax.random.key(1))
    b = gen(cfg, params, prompt, 6, Sampling(1.0), jax.random.key(2))
    assert (np.asarray(a) != np.asarray(b)).any()      # the key decides a sampled continuation
