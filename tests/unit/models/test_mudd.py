"""The trainable MUDD family: causality, the coefficient contract, interventions. Replay in
bfloat16 and at training width, and training: tests/integration/models/test_mudd_sweep.py."""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax.audit import interventions
from dynjax.coeffs import Axes, check
from dynjax.models import build
from tests.conftest import assert_causal, tiny_config

B, T, L = 4, 32, 3
VARIANTS = ("mudd", "mudd_static")


def _model(variant="mudd", **kw):
    c = tiny_config("dense", **kw).model
    c.family, c.variant = "mudd", variant
    return build(c.to_dict())


def _compiled(variant="mudd", dtype="float32"):
    """(model, jitted init, jitted apply), shared by the tests: compiling dominates their time."""
    return _compiled_cached(variant, dtype)


@functools.lru_cache(maxsize=None)
def _compiled_cached(variant, dtype):
    model = _model(variant, dtype=dtype)
    return model, jax.jit(model.init), jax.jit(model.apply)


def _tokens(seed=0):
    return jax.random.randint(jax.random.key(seed), (B, T), 0, 256)


def _randomize(params, where, scale, seed=2):
    """Add noise to every parameter whose path contains ``where`` (e.g. the DA output layer,
    which starts at zero, so that coefficients really vary with the input). numpy noise:
    no per-shape XLA compiles."""
    rng = np.random.default_rng(seed)

    def one(path, x):
        if where not in jax.tree_util.keystr(path):
            return x
        return x + (scale * rng.standard_normal(x.shape)).astype(x.dtype)
    return jax.tree_util.tree_map_with_path(one, params)


@pytest.fixture(scope="module")
def trained_like():
    """A mudd model whose DA MLPs and static biases are non-trivial, its jitted apply."""
    model, init, apply = _compiled("mudd")
    params = init(jax.random.key(1), _tokens())
    params = _randomize(_randomize(params, "'da'", 0.3), "static_bias", 0.3, seed=3)
    return model, params, apply


def test_causality(trained_like):
    model, params, apply = trained_like
    tokens = _tokens()
    assert_causal(apply, params, tokens)


def test_coefficient_shapes_and_schema(trained_like):
    model, params, apply = trained_like
    _, coeffs = apply(params, _tokens())
    assert model.schema == {"mix": [Axes(("stream", "example", "token", "source"))] * L}
    check(coeffs, model.schema)
    for i, a in enumerate(coeffs["mix"]):          # C_i streams (1 before the head), i+2 sources
        chex.assert_shape(a, (4 if i < L - 1 else 1, B, T, i + 2))
        assert a.dtype == jnp.float32
        assert float(jnp.std(a, axis=(1, 2)).min()) > 0   # per-token, not constant


REPLAY = [("mudd", "float32"), ("mudd", "bfloat16"), ("mudd_static", "float32")]
UNIT_REPLAY = [("mudd", "float32"), ("mudd_static", "float32")]   # the models the others use


def check_replay_is_bitwise(variant, dtype):
    """Replaying the recorded mixing coefficients gives the logits and them bit for bit."""
    _, init, apply = _compiled(variant, dtype)
    tokens = _tokens()
    params = _randomize(init(jax.random.key(1), tokens), "", 0.05)
    logits, coeffs = apply(params, tokens)
    replayed, coeffs2 = apply(params, tokens, coeffs)
    np.testing.assert_array_equal(np.asarray(replayed), np.asarray(logits), strict=True)
    assert all(np.array_equal(a, b) for a, b in zip(coeffs["mix"], coeffs2["mix"]))


@pytest.mark.parametrize("variant, dtype", UNIT_REPLAY)
def test_replay_is_bitwise(variant, dtype):
    check_replay_is_bitwise(variant, dtype)


def test_replay_ignores_the_da_controllers(trained_like):
    model, params, apply = trained_like
    tokens = _tokens()
    logits, coeffs = apply(params, tokens)
    broken = _randomize(params, "'da'", 1.0, seed=7)
    assert not np.array_equal(apply(broken, tokens)[0], logits)
    np.testing.assert_array_equal(apply(broken, tokens, coeffs)[0], logits, strict=True)


def test_initial_model_is_a_plain_residual_decoder():
    """At init every mix copies the newest source: the dense dynjax decoder's function."""
    tokens = _tokens()
    _, init, apply = _compiled("mudd")
    params = init(jax.random.key(1), tokens)
    logits, coeffs = apply(params, tokens)
    for a in coeffs["mix"]:
        np.testing.assert_array_equal(a, jnp.zeros_like(a).at[..., -1].set(1.0), strict=True)
    dense = build(tiny_config("dense", scan_layers=False).model.to_dict())
    blocks = {f"layer_{i}": {"block": {"attn": params[f"layer_{i}"]["block"]["attn"],
                                       "attn_norm": params[f"layer_{i}"]["block"]["q_norm"],
                                       "mlp": params[f"layer_{i}"]["block"]["mlp"],
                                       "mlp_norm": params[f"layer_{i}"]["block"]["mlp_norm"]}}
              for i in range(L)}
    dense_params = {"embed": params["embed"], "head": params["head"], "layers": blocks}
    np.testing.assert_allclose(jax.jit(dense.apply)(dense_params, tokens)[0], logits,
                               rtol=0, atol=1e-4)


def test_static_variant_has_constant_coefficients():
    _, init, apply = _compiled("mudd_static")
    tokens = _tokens()
    params = _randomize(init(jax.random.key(1), tokens), "static_bias", 0.5)
    assert all("'da'" not in jax.tree_util.keystr(p)
               for p, _ in jax.tree_util.tree_flatten_with_path(params)[0])
    _, coeffs = apply(params, tokens)
    for i, a in enumerate(coeffs["mix"]):
        bias = params[f"layer_{i}"]["static_bias"]
        np.testing.assert_array_equal(a, jnp.broadcast_to(bias[:, None, None, :], a.shape),
                                      strict=True)


def test_audit_conditions_on_mudd_coefficients(trained_like):
    """cross_input and structure_removed (SourceUniformMean) act on MUDD coefficients and
    replay through the model; SourceUniformMean keeps the signed sum per (layer, stream)."""
    model, params, apply = trained_like
    tokens, calib_tokens = _tokens(0), _tokens(5)
    logits, coeffs = apply(params, tokens)
    _, calib = apply(params, calib_tokens)
    schema = model.schema

    donated = interventions.cross_input(coeffs, schema, jax.random.key(0))
    donor = interventions.derangement(interventions.condition_keys(jax.random.key(0))[0], B)
    for a, d in zip(coeffs["mix"], donated["mix"]):
        np.testing.assert_array_equal(d, a[:, donor], strict=True)

    uniform = interventions.structure_removed(coeffs, schema, calib)
    for u, c in zip(uniform["mix"], calib["mix"]):
        assert u.shape[1:3] == (B, T)
        np.testing.assert_array_equal(u, np.broadcast_to(u[..., :1], u.shape),   # over sources
                                      strict=True)
        want = c.sum(axis=-1).mean(axis=(1, 2))                      # (stream,) signed sum
        np.testing.assert_allclose(u.sum(axis=-1), np.broadcast_to(want[:, None, None], u.shape[:3]),
                                   rtol=1e-5, atol=1e-6)
    for cond in (donated, uniform):
        out = apply(params, tokens, cond)[0]
        assert np.all(np.isfinite(out)) and not np.allclose(out, logits)
