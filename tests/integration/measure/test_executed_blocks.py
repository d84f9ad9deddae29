"""Executed blocks counted on whole models (tests/unit/measure/test_mod_measure.py holds the
FLOP counts): MoD's mean and histogram, integrated MoDE's blocks whose FFN ran."""
import jax
import numpy as np

from dynjax import coeffs as coeffs_lib
from dynjax.measure import lm_execution as ex
from dynjax.models import build
from dynjax.models.transformer import ModelConfig
from tests.unit.measure.test_mod_measure import CFG


def test_executed_blocks_mean_and_histogram():
    m = build(CFG)
    tokens = jax.random.randint(jax.random.key(0), (2, 32), 0, 256)
    counts = ex.executed_blocks(m, m.init(jax.random.key(1), tokens), tokens)
    s = ex.execution_summary(counts, CFG.n_layers)
    assert s["mean_executed_blocks"] == 2 + 2 * 0.25  # 2 dense blocks + 2 MoD at c = 1/4
    assert sum(s["histogram"]) == 64 and s["histogram"][:2] == [0, 0]


def test_executed_blocks_of_integrated_mode_count_only_blocks_whose_ffn_ran():
    cfg = ModelConfig(family="moe", variant="mode_integrated", d_model=32, n_heads=2,
                      n_layers=2, d_ff=64).replace(moe_capacity_factor=0.0)
    m = build(cfg)
    tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, 256)
    params = m.init(jax.random.key(1), tokens)
    # Send every token of layer 0 to the no-op expert, every token of layer 1 to expert 0.
    probs = np.zeros((2, 2, 16, 5), np.float32)
    probs[0, ..., 4], probs[1, ..., 0] = 1.0, 1.0
    _, sown = jax.jit(lambda p, r: m.module.apply(
        {"params": p}, tokens, coeffs_lib.replaying({"router": r}), mutable=["moe_stats"]))(
        params, probs)
    ran = np.asarray(sown["moe_stats"]["stats"][0]["ffn_ran"])
    np.testing.assert_array_equal(ran.sum(0), np.ones((2, 16)))
    counts = ex.executed_blocks(m, params, tokens)            # the model's own routing
    stats = ex.moe_stats(m, params, tokens)
    np.testing.assert_array_equal(counts, np.asarray(stats["ffn_ran"]).sum(0))
    assert counts.max() <= 2 and counts.shape == (2, 16)
