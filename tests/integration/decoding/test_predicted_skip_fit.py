"""The post-hoc skip predictor's fit (dynjax.measure.skip_predictors) learns its target, and
the skip FLOPs follow the slots (predicted-skip decoding: test_predicted_skip.py beside this
file, whose model this shares)."""
import jax
import numpy as np

from dynjax.measure import skip_predictors as ps
from tests.integration.decoding.test_predicted_skip import CFG, T, fg  # noqa: F401 (a fixture)


def test_fit_predictor_learns_its_target_and_flops_follow_the_slots(fg):
    _, params = fg
    windows = np.asarray(jax.random.randint(jax.random.key(5), (8, T), 0, 256))
    h, g = ps.record(CFG, params, windows)
    assert h.shape == (CFG.n_layers, 8, T, CFG.d_model) and g.shape == (CFG.n_layers, 8, T)
    tau = float(np.median(g))
    pred, loss = ps.fit_predictor(h, g, tau, hidden=16, steps=100, batch=64)
    r = ps.evaluate(CFG, params, pred, [T, T], windows, tau, recorded=(h, g))
    assert r["predictor_vs_gate"]["accuracy"] > 0.8, r
    assert loss.max() < 0.5
    full, half = (ps.skip_flops(CFG, T, s, 16)["blocks"] for s in ([T, T], [T // 2, T // 2]))
    assert half < 0.6 * full
