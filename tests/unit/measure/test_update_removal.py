"""Post-training skipping: thresholding gates and truncating depth on a fixed checkpoint."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax.measure import update_removal
from dynjax.models import build
from dynjax.models.transformer import ModelConfig

CFG = ModelConfig(family="gates", variant="feature_gate", d_model=32, n_heads=2, n_layers=3,
                  d_ff=64)


@pytest.fixture(scope="module")
def fg():
    model = build(CFG)
    windows = np.asarray(jax.random.randint(jax.random.key(0), (6, 16), 0, 256))
    return model, model.init(jax.random.key(1), jnp.asarray(windows[:1])), windows


def test_tau_zero_is_bitwise_the_plain_forward_and_tau_above_all_removes_every_update(fg):
    model, params, windows = fg
    tokens = jnp.asarray(windows)
    traces = []

    @jax.jit
    def replay(g):
        traces.append(1)
        return model.apply(params, tokens, {"gate": g})[0]

    logits, coeffs = jax.jit(lambda t: model.apply(params, t))(tokens)
    g = coeffs["gate"]
    chex.assert_trees_all_equal(replay(update_removal.threshold(g, 0.0)), logits)
    # Above every gate: no update survives, the same as keeping zero blocks.
    none = replay(update_removal.threshold(g, float(g.max()) + 1))
    chex.assert_trees_all_equal(none, replay(update_removal.truncate(g, 0)))
    chex.assert_trees_all_equal(none, replay(jnp.zeros_like(g)))
    assert np.abs(np.asarray(none - logits)).max() > 1e-3
    # Truncation keeps exactly the first K layers' gates.
    kept = np.asarray(update_removal.truncate(g, 2))
    np.testing.assert_array_equal(kept[:2], np.asarray(g)[:2])
    assert not kept[2:].any()
    assert len(traces) == 1  # every intervention reuses one compiled replay


def test_curves_span_nothing_removed_to_everything_removed(fg):
    _, _, windows = fg
    model = build(CFG.replace(variant="layer_static"))
    params = model.init(jax.random.key(1), jnp.asarray(windows[:1]))
    params["layer_gate"] = jnp.asarray([0.5, 1.5, 1.0])
    taus = update_removal.gate_quantile_taus(model, params, windows, n=3, batch_size=3)
    out = update_removal.skipping_curves(model, params, windows, taus, batch_size=3)
    th, tr = out["threshold"], out["truncate"]
    assert th[0]["removed"] == 0.0 and th[0]["bpb"] == pytest.approx(out["plain_bpb"], abs=1e-9)
    assert th[-1]["removed"] == 1.0 and th[-1]["bpb"] == pytest.approx(tr[0]["bpb"], abs=1e-9)
    # taus 0, quantiles 0.05 / 0.5 / 0.95 of {0.5, 1.0, 1.5} per token, above all.
    np.testing.assert_allclose([r["removed"] for r in th], [0, 0, 1 / 3, 2 / 3, 1])
    np.testing.assert_allclose([r["removed"] for r in tr], [1.0, 2 / 3, 1 / 3, 0.0])
    assert tr[-1]["bpb"] == pytest.approx(out["plain_bpb"], abs=1e-9)


def test_a_model_without_gates_is_a_clear_error():
    dense = build(ModelConfig(family="gates", variant="dense", d_model=32, n_heads=2,
                              n_layers=2, d_ff=64))
    with pytest.raises(ValueError, match="no gate coefficients"):
        update_removal.skipping_curves(dense, None, np.zeros((1, 8), np.int32), [0.0])
