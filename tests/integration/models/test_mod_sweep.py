"""MoD beyond the unit tier (tests/unit/models/test_mod.py holds the model and the checks):
the predictor's causal route, and generate against re-decoding the whole prefix each step."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax import decoding
from dynjax.models import mod
from tests.unit.models.test_mod import (  # noqa: F401 (model: a fixture)
    B, CFG, ROUTES, UNIT_ROUTES, model,
    check_causal_routing_is_causal_at_every_split_and_kv_cache_matches_it)


@pytest.mark.parametrize("route", [r for r in ROUTES if r not in UNIT_ROUTES])
def test_causal_routing_is_causal_at_every_split_and_kv_cache_matches_it_sweep(model, route):
    check_causal_routing_is_causal_at_every_split_and_kv_cache_matches_it(model, route)


def test_generate_is_greedy_decoding_over_cached_forward(model):
    _, params, tokens = model
    cfg = mod.decode_config(CFG, "predictor")
    prompt, steps = tokens[:, :3], 4
    out = jax.jit(lambda p: decoding.generate(cfg, params, p, steps))(prompt)
    assert out.shape == (B, 3 + steps) and np.array_equal(out[:, :3], prompt)
    seq = prompt
    for _ in range(steps):  # re-decode the whole prefix each time: the slow, obvious way
        logits, _ = decoding.cached_forward(cfg, params, seq)
        seq = jnp.concatenate([seq, jnp.argmax(logits[:, -1], -1)[:, None].astype(seq.dtype)], 1)
    np.testing.assert_array_equal(out, seq)
