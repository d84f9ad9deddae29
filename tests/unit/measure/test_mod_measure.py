"""Execution measures of MoD: executed blocks per token and FLOPs (compiled vs analytic)."""
import jax
import numpy as np
import pytest

from dynjax import coeffs as coeffs_lib
from dynjax.measure import lm_execution as ex
from dynjax.models import build
from dynjax.models.transformer import ModelConfig

CFG = ModelConfig(family="mod", variant="mod", d_model=32, n_heads=2, n_layers=4,
                  d_ff=64).replace(mod_capacity=0.25)


def test_executed_blocks_mean_and_histogram():
    m = build(CFG)
    tokens = jax.random.randint(jax.random.key(0), (2, 32), 0, 256)
    counts = ex.executed_blocks(m, m.init(jax.random.key(1), tokens), tokens)
    s = ex.execution_summary(counts, CFG.n_layers)
    assert s["mean_executed_blocks"] == 2 + 2 * 0.25  # 2 dense blocks + 2 MoD at c = 1/4
    assert sum(s["histogram"]) == 64 and s["histogram"][:2] == [0, 0]


def test_compiled_flops_track_the_analytic_count_and_mod_saves():
    mod_r = ex.flop_report(CFG, 2, 64)
    dense_r = ex.flop_report(CFG.replace(variant="dense"), 2, 64)
    for r in (mod_r, dense_r):
        assert 0.9 < r["compiled_flops"] / r["analytic_flops"] < 1.2
    assert mod_r["analytic_parts"]["mod_attention"] > 0 and mod_r["analytic_parts"]["predictor"] > 0
    assert mod_r["compiled_flops"] < 0.75 * dense_r["compiled_flops"]


@pytest.mark.parametrize("name", ["gates/feature_gate", "mod/mod predictor (causal)",
                                  "mod/mode_staged router, 16 slots", "moe/moe top-2",
                                  "moe/mode_integrated", "mudd/mudd"])
def test_compiled_and_analytic_flops_agree_within_5_percent(name):
    """The analytic count misses no controller: routers, predictor, expert buffers,
    dispatch/combine, DA MLPs and mixes (benchmarks/flop_agreement.py runs every case)."""
    from benchmarks import flop_agreement
    assert 0.99 < flop_agreement.agreement(name)["ratio"] < 1.05


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
