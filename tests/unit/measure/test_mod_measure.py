"""Execution measures of MoD: FLOPs, compiled against analytic (executed blocks per token on whole
models: tests/integration/measure/test_executed_blocks.py)."""
import pytest

from dynjax.measure import lm_execution as ex
from dynjax.models.transformer import ModelConfig

CFG = ModelConfig(family="mod", variant="mod", d_model=32, n_heads=2, n_layers=4,
                  d_ff=64).replace(mod_capacity=0.25)


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
