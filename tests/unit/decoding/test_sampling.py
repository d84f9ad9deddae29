"""Sampled decoding: top-k / nucleus masks, the sampled distribution, greedy as before,
streaming equal to generate (sample.py as a command:
tests/integration/decoding/test_sample_program.py)."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax import decoding
from dynjax.decoding.sampling import Sampling, filtered_logits, next_token
from dynjax.models import build
from tests.conftest import tiny_config

PROBS = jnp.log(jnp.asarray([[0.15, 0.5, 0.05, 0.3]]))   # ranked: 1, 3, 0, 2


def kept(logits):
    return np.isfinite(np.asarray(logits))[0].tolist()


def test_top_k_keeps_the_k_most_likely():
    assert kept(filtered_logits(PROBS, top_k=2)) == [False, True, False, True]
    assert kept(filtered_logits(PROBS, top_k=1)) == [False, True, False, False]
    chex.assert_trees_all_equal(filtered_logits(PROBS), PROBS)


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    # 0.5 + 0.3 reaches 0.8: two tokens; 0.81 needs the third (0.15)
    assert kept(filtered_logits(PROBS, top_p=0.8)) == [False, True, False, True]
    assert kept(filtered_logits(PROBS, top_p=0.81)) == [True, True, False, True]
    assert kept(filtered_logits(PROBS, top_p=0.01)) == [False, True, False, False]
    # kept logits are unchanged (renormalisation is the softmax's job)
    np.testing.assert_array_equal(np.asarray(filtered_logits(PROBS, top_p=0.8))[0, [1, 3]],
                                  np.asarray(PROBS)[0, [1, 3]])


def test_sampled_tokens_follow_the_filtered_distribution():
    keys = jax.random.split(jax.random.key(0), 20000)
    draw = jax.vmap(lambda k, s: next_token(PROBS, k, s)[0], in_axes=(0, None))
    freq = np.bincount(np.asarray(draw(keys, Sampling(1.0))), minlength=4) / len(keys)
    np.testing.assert_allclose(freq, [0.15, 0.5, 0.05, 0.3], atol=0.015)
    nucleus = np.bincount(np.asarray(draw(keys, Sampling(1.0, top_p=0.8))), minlength=4)
    np.testing.assert_allclose(nucleus / len(keys), [0, 0.5 / 0.8, 0, 0.3 / 0.8], atol=0.015)
    cold = np.bincount(np.asarray(draw(keys, Sampling(0.25))), minlength=4) / len(keys)
    assert cold[1] > 0.85          # p^(1/T): 0.5^4 / sum = 0.87
    assert (np.asarray(draw(keys[:50], Sampling(1.0, top_k=1))) == 1).all()


def test_bad_options_are_refused():
    for bad in (dict(temperature=-1.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            Sampling(**bad)


def test_sampling_without_a_key_is_refused():
    """By generate and stream alike, before anything runs (abstract parameters suffice)."""
    cfg = build(tiny_config("feature_gate", n_layers=2).model.to_dict()).cfg
    prompt = jnp.zeros((2, 6), jnp.int32)
    params = jax.eval_shape(build(cfg).init, jax.random.key(1), prompt)
    for run in (decoding.generate, lambda *args: next(decoding.stream(*args))):
        with pytest.raises(ValueError, match="needs a PRNG key"):
            run(cfg, params, prompt, 2, Sampling(1.0))
