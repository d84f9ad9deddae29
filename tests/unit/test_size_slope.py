"""The size slope of the FCA penalties: a power law is recovered exactly, an incomplete row's
uncertainty comes from its seeds, and the prediction extrapolates along the fitted line."""
import math
import os
import sys

import pytest

from tests.conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "experiments"))
size_slope = pytest.importorskip("size_slope")


def _row(variant, size, steps, estimate=None, seeds=()):
    audit = None if estimate is None else {"units": 3, "conditions": {"cross_input": {
        "estimate": estimate, "ci_low": estimate / math.e, "ci_high": estimate * math.e}}}
    return {"variant": variant, "size": size, "steps": steps, "audit": audit,
            "seed_audits": {str(i): {"conditions": {"cross_input": {"estimate": s}}}
                            for i, s in enumerate(seeds)}}


def test_a_power_law_is_recovered_and_extrapolated():
    results = {"paper": {"feature_gate": {"conditions": {"cross_input": 0.001}}},
               "rows": [_row("feature_gate", "tiny", 5000, 0.1),
                        _row("feature_gate", "large", 3000, 0.01)]}
    params = {"feature_gate": {"tiny": 1e6, "large": 1e7}, "mudd": {"tiny": 1, "large": 2}}
    out = size_slope.slopes(results, params)
    assert list(out) == ["feature_gate/cross_input"]       # no MUDD rows, nothing invented
    fit = out["feature_gate/cross_input"]
    assert fit["slope"] == pytest.approx(-1.0)
    # each point's CI spans e^2 on the log scale: se 2/3.92, two points over ln 10
    assert fit["slope_se"] == pytest.approx(math.hypot(2 / 3.92, 2 / 3.92) / math.log(10))
    assert fit["prediction"]["delta_nll"] == pytest.approx(0.01 * 1e7 / 76e6)
    low, high = fit["prediction"]["range95"]
    assert low < fit["prediction"]["delta_nll"] < high
    assert fit["prediction"]["paper"] == 0.001


def test_an_incomplete_row_uses_its_seeds_spread():
    rows = [_row("mudd", "tiny", 5000, 0.4), _row("mudd", "large", 3000, seeds=(0.3, 0.5))]
    p = size_slope.point(rows[1], "cross_input")
    assert p["estimate"] == pytest.approx(0.4) and p["seeds"] == 2
    assert p["se_log"] == pytest.approx(math.sqrt(0.02) / (0.4 * math.sqrt(2)))
    assert size_slope.point(_row("mudd", "large", 3000, seeds=(0.3,)), "cross_input") is None
