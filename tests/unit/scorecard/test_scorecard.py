"""The scorecard's classifier execution panel on a structured DynamicGate-MLP (its
open-blocks path beside the masked forward) and the execution verdict's choice between them.
The scorecards of whole checkpoints are tested with the runs they audit: language models and
MUDDPythia in tests/integration/audit/test_audit_run.py, a DynamicGate-MLP run in tests/integration/audit/test_audit_families.py."""
import jax
import jax.numpy as jnp
import pytest

from configs import scorecard as scorecard_config
from dynjax import scorecard
from dynjax.measure import execution, macs
from dynjax.measure.lm_execution import compiled_cost
from dynjax.models.gated_mlp import GatedMLP, MLPConfig, structured_forward

SETTINGS = {"tau": 1.0, "theta": 0.5, "gates_open": False}


def test_structured_panel_counts_open_blocks_and_both_programs():
    """A structured MLP keeps exactly k blocks per example, so its open units are k x block
    size; its open-blocks path's analytic FLOPs are RelMAC's numerator and its compiled
    FLOPs XLA's count of structured_forward, each over the dense MLP's."""
    cfg = MLPConfig(in_dim=24, hidden=(32, 32), n_classes=5, variant="structured",
                    block_size=8, keep_fraction=0.5, gate_hidden=4)
    model = GatedMLP(cfg)
    x = jax.random.normal(jax.random.key(1), (8, 24))
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


def test_execution_verdict_takes_the_faster_program():
    """A structured model's verdict is its open-blocks path's when that one does better;
    otherwise (and on ties) the model's own forward's."""
    th = scorecard_config.get_config().thresholds
    lat = lambda r: {f"forward_b{th.latency_batch}": {"ratio": r}}
    card = {"execution": {"flops_ratio_compiled": 1.1, "latency": lat(1.2),
                          "structured": {"flops_ratio_compiled": 0.5, "latency": lat(0.6)}}}
    v = scorecard.verdicts(card, th)["execution"]
    assert v.startswith("executes less") and "open-blocks path" in v
    card["execution"]["structured"]["latency"] = lat(3.0)
    assert scorecard.verdicts(card, th)["execution"].startswith("saves FLOPs but not time")
    card["execution"]["structured"]["flops_ratio_compiled"] = 1.2
    v = scorecard.verdicts(card, th)["execution"]
    assert v.startswith("no skipping") and "open-blocks" not in v and "of dense" in v


def test_verdicts_per_coefficient_family():
    """With families audited apart (audit.py --hf --config.sites), each family gets its own
    variation line (from its leaves' input shares only) and dependence line (from its own
    table's rows)."""
    th = scorecard_config.get_config().thresholds
    lat = {f"forward_b{th.latency_batch}": {"ratio": 1.0}}
    row = lambda est, low: {"estimate": est, "ci_low": low, "ci_high": est + 1, "label": "L"}
    strong, none = th.depends_min_dnll + 0.5, th.depends_min_dnll - 0.5
    card = {"execution": {"flops_ratio_compiled": 1.0, "latency": lat},
            "variation": {"input_share": {"['router']": 0.9, "['attn_gate']": 0.0}},
            "dependence": {"conditions": {"cross_input": row(1.0, strong)}, "families": {
                "router": {"sites": ["router"],
                           "conditions": {"cross_input": row(1.0, strong)}},
                "attn_gate": {"sites": ["attn_gate"],
                              "conditions": {"cross_input": row(0.0, none)}}}}}
    v = scorecard.verdicts(card, th)
    assert set(v["families"]) == {"router", "attn_gate"}
    assert v["families"]["router"]["variation"].startswith("varies (up to 90.0%")
    assert v["families"]["attn_gate"]["variation"].startswith("nearly static")
    assert v["families"]["router"]["dependence"].startswith("function depends on it")
    assert v["families"]["attn_gate"]["dependence"].startswith("little dependence")
