"""The residual-gate family: causality, the coefficient contract, variants' definitions.
Replay in bfloat16 and with unrolled layers: tests/integration/models/test_gates_sweep.py;
FeatureGate's gradient under remat: tests/integration/models/test_gates_remat.py."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax.coeffs import Axes
from dynjax.models import build
from dynjax.models.transformer import next_token_nll
from tests.conftest import assert_causal, tiny_config

GATED = ("uniform", "layer_static", "feature_gate")
ALL = ("dense",) + GATED + ("fixed_depth",)


def _model(variant, **kw):
    return build(tiny_config(variant, **kw).model.to_dict())


def _tokens(seed=0, shape=(4, 32)):
    return jax.random.randint(jax.random.key(seed), shape, 0, 256)


@pytest.mark.parametrize("variant", ALL)
def test_causality(variant, tiny_model):
    """Changing bytes after position t never changes logits at positions <= t."""
    _, params, tokens, apply = tiny_model(variant)
    assert_causal(apply, params, tokens)


def test_loss_is_next_token_prediction():
    """The NLL at position t scores byte t + 1 under logits t (hand-computed): a loss that
    scored byte t, which the causal model sees, would train a copy and still fall."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 5, 7)).astype(np.float32)
    tokens = rng.integers(0, 7, (2, 5))
    b, t = np.meshgrid(np.arange(2), np.arange(4), indexing="ij")
    logz = np.log(np.exp(logits[:, :-1].astype(np.float64)).sum(-1))
    want = logz - logits[b, t, tokens[:, 1:]]
    np.testing.assert_allclose(next_token_nll(jnp.asarray(logits), jnp.asarray(tokens)), want,
                               rtol=1e-5)


REPLAY = [("float32", True), ("bfloat16", True), ("float32", False)]   # (dtype, scan_layers)
UNIT_REPLAY = [("float32", True)]     # the models test_causality compiled


def check_replay_is_bitwise(tiny_model, variant, dtype, scan):
    """Replaying the recorded gates gives the logits and gates bit for bit."""
    model, params, tokens, apply = tiny_model(variant, dtype=dtype, scan_layers=scan)
    logits, coeffs = apply(params, tokens)
    assert set(coeffs) == {"gate"}
    chex.assert_shape(coeffs["gate"], (3, 4, 32))          # (layer, example, token)
    assert coeffs["gate"].dtype == jnp.float32
    assert model.schema == {"gate": Axes(("layer", "example", "token"))}
    replayed, coeffs2 = apply(params, tokens, coeffs)
    np.testing.assert_array_equal(np.asarray(replayed), np.asarray(logits), strict=True)
    np.testing.assert_array_equal(np.asarray(coeffs2["gate"]), np.asarray(coeffs["gate"]),
                                  strict=True)


@pytest.mark.parametrize("dtype, scan", UNIT_REPLAY)
@pytest.mark.parametrize("variant", GATED)
def test_replay_is_bitwise(variant, dtype, scan, tiny_model):
    check_replay_is_bitwise(tiny_model, variant, dtype, scan)


def test_replay_ignores_the_controller(tiny_model):
    """Replay ignores the controller: changing its parameters changes record, not replay."""
    _, params, tokens, apply = tiny_model()
    logits, coeffs = apply(params, tokens)
    broken = jax.tree_util.tree_map_with_path(
        lambda path, x: x + 3.0 if "controller" in jax.tree_util.keystr(path) else x, params)
    assert not np.array_equal(apply(broken, tokens)[0], logits)
    np.testing.assert_array_equal(apply(broken, tokens, coeffs)[0], logits, strict=True)


def test_replay_is_exact_where_the_features_are_not_finite(tiny_model):
    """Layer 0's MLP scaled by 1e21: its update stays finite but the update-norm feature
    overflows to inf, so the controller's gate is not finite. Replaying gate 0 there leaves
    h unchanged (0 * finite update), so the logits equal bitwise those of the unscaled
    model; a tie such as ``gate + 0 * sum(features)`` would have made them NaN."""
    _, params, tokens, apply = tiny_model()
    scale = lambda path, x: x.at[0].multiply(1e21) if "mlp" in jax.tree_util.keystr(path) \
        and "down" in jax.tree_util.keystr(path) else x
    huge = jax.tree_util.tree_map_with_path(scale, params)
    _, recorded = apply(huge, tokens)
    assert not np.isfinite(np.asarray(recorded["gate"][0])).all()   # the premise
    _, coeffs = apply(params, tokens)
    given = {"gate": coeffs["gate"].at[0].set(0.0)}
    replayed = apply(huge, tokens, given)[0]
    assert np.isfinite(np.asarray(replayed)).all()
    np.testing.assert_array_equal(np.asarray(replayed),
                                  np.asarray(apply(params, tokens, given)[0]), strict=True)


def test_replayed_gates_are_used(tiny_model):
    """Replay uses the given values verbatim: different gates, different logits."""
    _, params, tokens, apply = tiny_model()
    logits, coeffs = apply(params, tokens)
    halved = {"gate": coeffs["gate"] * 0.5}
    assert not np.allclose(apply(params, tokens, halved)[0], logits)


def test_dense_equals_gate_fixed_at_one(tiny_model):
    _, params, tokens, fg_apply = tiny_model()
    dense_params = {k: v for k, v in params.items()}
    dense_params["layers"] = {"block": params["layers"]["block"]}
    dense_logits = tiny_model("dense").apply(dense_params, tokens)[0]
    ones = {"gate": jnp.ones((3, 4, 32), jnp.float32)}
    gated_logits = fg_apply(params, tokens, ones)[0]
    np.testing.assert_array_equal(gated_logits, dense_logits)
    uniform_one = tiny_model("uniform", uniform_value=1.0).apply(dense_params, tokens)[0]
    np.testing.assert_array_equal(uniform_one, dense_logits)


def test_uniform_and_layer_static_coefficients(tiny_model):
    for variant, n_values in (("uniform", 1), ("layer_static", 3)):
        _, params, tokens, apply = tiny_model(variant)
        key = "uniform_gate" if variant == "uniform" else "layer_gate"
        params[key] = jnp.arange(1.0, 1.0 + np.size(params[key]), dtype=jnp.float32).reshape(
            np.shape(params[key]))
        gate = apply(params, tokens)[1]["gate"]
        # constant over examples and tokens, one value per layer (or one overall)
        assert np.unique(np.asarray(gate)).size == n_values
        assert np.all(gate == gate[:, :1, :1])


def _count_dots(model, tokens):
    params = jax.eval_shape(model.init, jax.random.key(0), tokens)
    return jax.jit(model.apply).lower(params, tokens).as_text().count("stablehlo.dot_general")


def test_fixed_depth_compiles_to_k_blocks():
    """fixed_depth builds a genuinely shallower program: k blocks' worth of matmuls, and a
    k-step layer scan; not a zero gate on the full depth."""
    tokens = _tokens()
    unrolled = dict(scan_layers=False)
    per_block = (_count_dots(_model("dense", n_layers=2, **unrolled), tokens)
                 - _count_dots(_model("dense", n_layers=1, **unrolled), tokens))
    head = _count_dots(_model("dense", n_layers=1, **unrolled), tokens) - per_block
    for k in (1, 2):
        model = _model("fixed_depth", fixed_depth=k, **unrolled)
        assert _count_dots(model, tokens) == head + k * per_block
    scanned = _model("fixed_depth", fixed_depth=2)
    params = scanned.init(jax.random.key(0), tokens)
    jaxpr = jax.make_jaxpr(scanned.apply)(params, tokens)
    lengths = [e.params["length"] for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]
    assert lengths == [2]
    assert jax.tree.leaves(params["layers"])[0].shape[0] == 2


@pytest.mark.parametrize("bad, match", [
    (dict(variant="sparse"), "unknown model.variant"),
    (dict(d_model=33), "not divisible"),
    (dict(dtype="float16"), "model.dtype"),
    (dict(variant="fixed_depth", fixed_depth=9), "fixed_depth=9"),
    (dict(colour="red"), "unknown model config field"),
])
def test_bad_model_config_errors(bad, match):
    cfg = tiny_config("dense").model.to_dict()
    cfg.update(bad)
    with pytest.raises(ValueError, match=match):
        build(cfg)


def test_wrong_coefficients_error(tiny_model):
    model, params, tokens, _ = tiny_model()
    with pytest.raises(ValueError, match="schema"):
        model.apply(params, tokens, {"mix": jnp.ones((3, 4, 32))})
    with pytest.raises(ValueError, match="axes"):
        model.apply(params, tokens, {"gate": jnp.ones((3, 4))})


def test_param_count_of_paper_presets():
    """featuregate_76m counts ~76M parameters (the paper: 75.9M)."""
    from configs import featuregate_76m, featuregate_504m

    def count(cfg):
        model = build(cfg.model.to_dict())
        shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
        return sum(int(np.prod(s.shape)) for s in jax.tree.leaves(shapes))

    n76 = count(featuregate_76m.get_config("feature_gate"))
    assert 74e6 < n76 < 78e6, n76
    n504 = count(featuregate_504m.get_config("feature_gate"))
    assert 480e6 < n504 < 530e6, n504
    fd15 = count(featuregate_76m.get_config("fixed_depth15"))
    assert fd15 < n76 * 0.7
