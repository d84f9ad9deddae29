"""Redraw every figure under results/ from the data file beside it, with its SVG and PDF twins.

    .venv/bin/python scripts/figures.py            # every figure
    .venv/bin/python scripts/figures.py --list     # which data file draws which figure

No training, no audit: each figure is a function of one committed JSON (an audit's
results.json, a scorecard.json, the FCA sweep's results.json, skipping.json,
conversion.json, a DynamicGate-MLP curve, the routing study's per_layer.json and
expert_importance.json), found by its name and keys. tests/unit/test_figures.py
checks the same figures.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse  # noqa: E402
import json  # noqa: E402

from dynjax.figures import save  # noqa: E402


def _audit(path, data):
    from dynjax.audit import report
    return [(path.parent / name, lambda fn=fn: fn(data)) for name, fn in report.plotters(data)]


def _scorecard(path, data):
    from dynjax.scorecard import report
    return [(path.parent / f"scorecard_{i}.png", lambda card=card: report.plot(card))
            for i, card in enumerate(data["cards"])]


def _fca_sweep(path, data):
    from experiments import fca_sweep
    return [(path.parent / name, lambda v=variant: fca_sweep.plot_family(data, v))
            for variant, name in (("feature_gate", "featuregate.png"), ("mudd", "mudd.png"))]


def _skipping(path, data):
    from experiments import gate_skipping
    return [(path.with_suffix(".png"),
             lambda: gate_skipping.plot(data["checkpoints"], data.get("windows")))]


def _conversion(path, data):
    from experiments import conversion
    return [(path.parent / "bpb_vs_flops.png", lambda: conversion.plot(data))]


def _curve(path, data):
    from experiments import dgmlp_curve
    return [(path.with_suffix(".png"), lambda: dgmlp_curve.plot(data["points"], data["dataset"]))]


def _routing_study(path, data):
    from experiments import routing_study
    draw = {"per_layer.json": routing_study.plot_layers,
            "expert_importance.json": routing_study.plot_experts}[path.name]
    return [(path.with_suffix(".png"), lambda: draw(data))]


# (how the data file is recognised, what draws its figures)
KINDS = (
    (lambda p, d: p.name == "results.json" and "conditions" in d, _audit),
    (lambda p, d: p.name == "scorecard.json", _scorecard),
    (lambda p, d: p.name == "results.json" and "paper" in d and "rows" in d, _fca_sweep),
    (lambda p, d: p.name == "skipping.json", _skipping),
    (lambda p, d: p.name == "conversion.json", _conversion),
    (lambda p, d: p.name.endswith("_curve.json") and "points" in d, _curve),
    (lambda p, d: p.parent.name == "routing_study" and p.name in (
        "per_layer.json", "expert_importance.json"), _routing_study),
)


def figures(results: Path = ROOT / "results") -> list:
    """(PNG path, zero-argument function drawing its figure) of every figure under
    ``results``, sorted by path."""
    out = []
    for path in sorted(results.rglob("*.json")):
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            continue
        for match, draw in KINDS:
            if match(path, data):
                out += draw(path, data)
    return sorted(out, key=lambda item: str(item[0]))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=str(ROOT / "results"))
    ap.add_argument("--list", action="store_true", help="list the figures and exit")
    args = ap.parse_args(argv)
    for png, draw in figures(Path(args.results)):
        rel = png.relative_to(ROOT) if png.is_relative_to(ROOT) else png
        if args.list:
            print(rel)
            continue
        save(draw(), png)
        print(f"wrote {rel} (+ .svg, .pdf)")


if __name__ == "__main__":
    main()
