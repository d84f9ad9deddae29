"""Replay exact by construction: every family's record and replay are one compiled program.

``dynjax.coeffs.site`` selects the given or the computed coefficients by a flag that is data,
so a forward traced once serves both modes (``chex.assert_max_traces``), and the replay of
the recorded coefficients through it is bitwise the record. The unit tier checks FeatureGate's
forward; every other family's is tests/integration/models/test_replay_sweep.py.
"""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax import coeffs as coeffs_lib
from dynjax.audit import interventions
from dynjax.audit.engine import Engine
from dynjax.models import build
from dynjax.models.gated_mlp import GatedMLP, MLPConfig
from dynjax.models.transformer import next_token_nll
from tests.conftest import normal, perturbed, tiny_config

LM = {"feature_gate": ("configs.tiny", "feature_gate", {}),
      "layer_static": ("configs.tiny", "layer_static", {}),
      "mod_predictor": ("configs.mod_tiny", "mod", {"mod_route": "predictor"}),
      "mode_staged": ("configs.mode_tiny", "mode_staged", {}),
      "mode_integrated": ("configs.mode_tiny", "mode_integrated", {}),
      "mudd": ("configs.mudd_tiny", "mudd", {})}


@functools.lru_cache(maxsize=None)
def _lm(name):
    """(apply, schema, perturbed params, tokens), one per name for the module: its init and
    the engine's forward compile once."""
    import importlib
    module, variant, overrides = LM[name]
    c = importlib.import_module(module).get_config(variant)
    c.model.update(dict(d_model=32, n_heads=2, n_layers=2, d_ff=64, **overrides))
    model = build(c.model.to_dict())
    tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, 256)
    params = model.init(jax.random.key(1), tokens)
    params = perturbed(params, 2, 0.1)
    return model.apply, model.schema, params, tokens


def _mlp():
    model = GatedMLP(MLPConfig(in_dim=12, hidden=(16, 16), n_classes=3, variant="dgate",
                               gate_bias_init=0.0))
    x = normal(1, (8, 12))
    return model.apply, model.schema, model.init(jax.random.key(0), x), x


def _muddpythia():
    import pathlib
    from dynjax.loaders import muddpythia_hf
    from dynjax.models import muddpythia
    with np.load(pathlib.Path(__file__).parents[3] / "tests" / "data" / "muddpythia_tiny.npz") as z:
        sd = {k[len("params/"):]: z[k] for k in z.files if k.startswith("params/")}
        ids = jnp.asarray(z["input_ids"])
    cfg, params = muddpythia_hf.from_state_dict(sd)
    return (lambda p, x, c=None: muddpythia.apply(cfg, p, x, c)), muddpythia.schema(cfg), \
        params, ids


def _target(name):
    return {"dgate_mlp": _mlp, "muddpythia": _muddpythia}.get(name, lambda: _lm(name))()


TARGETS = list(LM) + ["dgate_mlp", "muddpythia"]
UNIT = ["feature_gate"]


def check_record_and_replay_are_one_program(name):
    """One trace serves record and replay; the replay is bitwise the record."""
    apply, schema, params, x = _target(name)
    chex.clear_trace_counter()   # the counter is keyed by the lambda below, shared by the cases
    forward = jax.jit(chex.assert_max_traces(lambda p, x_, g: apply(p, x_, g), n=1))
    shapes = jax.eval_shape(lambda p, x_: apply(p, x_)[1], params, x)
    logits, coeffs = forward(params, x, coeffs_lib.recording(coeffs_lib.zeros_like(shapes)))
    coeffs_lib.check(coeffs, schema)
    replayed, again = forward(params, x, coeffs_lib.replaying(coeffs))   # no second trace
    np.testing.assert_array_equal(np.asarray(replayed), np.asarray(logits))
    chex.assert_trees_all_equal(again, coeffs)


@pytest.mark.parametrize("name", UNIT)
def test_record_and_replay_are_one_program(name):
    check_record_and_replay_are_one_program(name)


def test_site_selects_exactly():
    """The computed values at record, the given ones at replay, bit for bit, whatever the
    other branch holds (inf, NaN); nothing given: the computed values unchanged."""
    computed = jnp.array([1.5, jnp.inf, jnp.nan, -0.0])
    given = jnp.array([jnp.nan, 2.0, 3.0, 0.0])
    site = jax.jit(coeffs_lib.site)
    rec = site(computed, coeffs_lib.recording(given))
    rep = site(computed, coeffs_lib.replaying(given))
    np.testing.assert_array_equal(np.asarray(rec), np.asarray(computed), strict=True)
    assert np.signbit(rec[3])
    np.testing.assert_array_equal(np.asarray(rep), np.asarray(given), strict=True)
    assert coeffs_lib.site(computed, None) is computed


def test_audit_engine_compiles_one_forward():
    """The engine's record, its replay check and an intervention's replay run one program."""
    apply, schema, params, tokens = _lm("feature_gate")
    engine = Engine(apply, schema, rows=2, window=16)
    windows = np.asarray(jax.random.randint(jax.random.key(5), (3, 16), 0, 256))
    rec = engine.record(params, windows)
    assert rec.max_abs_dlogit == 0.0
    np.testing.assert_array_equal(rec.nll_replay, rec.nll_record)
    engine.deterministic_nll("static_profile", params, windows, rec, rec.coeffs)
    assert engine.forward._cache_size() == 1


def test_each_window_is_replayed_with_its_own_reassigned_coefficients():
    """The engine's (reassignment, window) losses equal replaying the whole window set with
    the condition applied to the whole cache (a derangement is global over windows), row w
    for window w: rows of another window's set would give the same kind of penalty, so only
    the values show it."""
    apply, schema, params, _ = _lm("feature_gate")
    engine = Engine(apply, schema, rows=2, window=16)
    windows = np.asarray(jax.random.randint(jax.random.key(5), (3, 16), 0, 256))
    rec = engine.record(params, windows)
    keys = jax.random.split(jax.random.key(7), 2)
    names = ("cross_input", "token_shuffle")
    got = engine.randomized_nll(names, params, windows, rec, keys, max_reassign_bytes=1 << 30)
    replay = jax.jit(lambda c: next_token_nll(
        apply(params, windows, coeffs_lib.replaying(c))[0], windows).mean(-1))
    for name in names:
        want = np.stack([replay(interventions.CONDITIONS[name].fn(rec.coeffs, schema, k))
                         for k in keys])
        np.testing.assert_allclose(got[name], want, rtol=1e-5, err_msg=name)
        assert not np.allclose(want, rec.nll_record[None], rtol=1e-3)   # it is a penalty
