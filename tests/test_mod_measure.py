"""Execution measures of MoD: executed blocks per token and FLOPs (compiled vs analytic)."""
import dataclasses

import jax

from dynjax.measure import execution as ex
from dynjax.models import build
from dynjax.models.transformer import ModelConfig

CFG = ModelConfig(family="mod", variant="mod", d_model=32, n_heads=2, n_layers=4, d_ff=64,
                  mod_capacity=0.25)


def test_executed_blocks_mean_and_histogram():
    m = build(CFG)
    tokens = jax.random.randint(jax.random.key(0), (2, 32), 0, 256)
    counts = ex.executed_blocks(m, m.init(jax.random.key(1), tokens), tokens)
    s = ex.execution_summary(counts, CFG.n_layers)
    assert s["mean_executed_blocks"] == 2 + 2 * 0.25  # 2 dense blocks + 2 MoD at c = 1/4
    assert sum(s["histogram"]) == 64 and s["histogram"][:2] == [0, 0]


def test_compiled_flops_track_the_analytic_count_and_mod_saves():
    mod_r = ex.flop_report(CFG, 2, 64)
    dense_r = ex.flop_report(dataclasses.replace(CFG, variant="dense"), 2, 64)
    for r in (mod_r, dense_r):
        assert 0.9 < r["compiled_flops"] / r["analytic_flops"] < 1.2
    assert mod_r["analytic_parts"]["mod_blocks"] > 0
    assert mod_r["compiled_flops"] < 0.75 * dense_r["compiled_flops"]
