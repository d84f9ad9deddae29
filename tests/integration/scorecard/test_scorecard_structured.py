"""The scorecard's classifier execution panel on a structured DynamicGate-MLP, timed and
compiled (the verdict that reads it: tests/unit/scorecard/test_scorecard.py): open blocks,
RelMAC and both programs' FLOPs."""
import jax
import jax.numpy as jnp
import pytest

from dynjax.measure import execution, macs
from dynjax.measure.lm_execution import compiled_cost
from dynjax.models.gated_mlp import GatedMLP, MLPConfig, structured_forward
from tests.conftest import normal

SETTINGS = {"tau": 1.0, "theta": 0.5, "gates_open": False}


def test_structured_panel_counts_open_blocks_and_both_programs():
    """A structured MLP keeps exactly k blocks per example, so its open units are k x block
    size; its open-blocks path's analytic FLOPs are RelMAC's numerator and its compiled
    FLOPs XLA's count of structured_forward, each over the dense MLP's."""
    cfg = MLPConfig(in_dim=24, hidden=(32, 32), n_classes=5, variant="structured",
                    block_size=8, keep_fraction=0.5, gate_hidden=4)
    model = GatedMLP(cfg)
    x = normal(1, (8, 24))
    params = model.init(jax.random.key(0), x)
    ex = execution.classifier_execution_panel(model, params, x, SETTINGS, (1,), repeats=1)
    assert ex["open_units_per_example"] == [16.0, 16.0] and ex["executed_fraction"] == 0.5
    _, _, aux = model.apply(params, x, with_aux=True, **SETTINGS)
    rep = macs.report(model.dims, macs.model_mac_sums(model, aux["open"]), 8)
    dense_macs = 24 * 32 + 32 * 32 + 32 * 5
    st = ex["structured"]
    assert ex["relmac"] == rep["relmac"]
    assert st["flops_ratio_analytic"] == pytest.approx(rep["macs_per_example"] / dense_macs)
    x1 = jnp.zeros((1, 24))
    twin = GatedMLP(MLPConfig(in_dim=24, hidden=(32, 32), n_classes=5, variant="dense"))
    dense = compiled_cost(lambda p, x: twin.apply(p, x)[0],
                          twin.init(jax.random.key(0), x1), x1)["flops"]
    assert st["flops_ratio_compiled"] == compiled_cost(
        lambda p, x: structured_forward(cfg, p, x), params, x1)["flops"] / dense
    assert st["flops_ratio_compiled"] < 1 < ex["flops_ratio_compiled"]
    assert set(st["latency"]) == set(ex["latency"]) == {"forward_b1"}
    for row in (ex["latency"]["forward_b1"], st["latency"]["forward_b1"]):
        # each round's model/dense ratio is recorded; one round: it is the ratio of medians
        assert row["ratio_rounds"] == [row["seconds"] / row["dense_seconds"]] == [row["ratio"]]
