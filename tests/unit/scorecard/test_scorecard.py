"""The execution verdict's choice between a structured model's two programs (the panel that
times them: tests/integration/scorecard/test_scorecard_structured.py). The scorecards of whole
checkpoints are tested with the runs they audit: language models and MUDDPythia in
tests/integration/audit/test_audit_run.py, a DynamicGate-MLP run in
tests/integration/audit/test_audit_families.py."""
from configs import scorecard as scorecard_config
from dynjax import scorecard


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
