"""How the FCA penalties scale with size: the slope of log ΔNLL against log parameters.

    python experiments/size_slope.py   # results/fca_sweep/results.json -> size_slope.json

For each family and condition, from the sweep's longest tiny row (5,000 steps) and its larger
row (3,000 steps): slope = Δ log ΔNLL / Δ log parameters, its standard error by the delta
method from each point's uncertainty, and what the slope predicts at the paper's size
(FeatureGate 76M, MUDDPythia 1.4B): a straight-line extrapolation over one or two orders of
magnitude from two points, so a prediction to compare with the paper, not a measurement.

A point's log-scale standard error: from its 95% CI, (ln high − ln low) / 3.92, for a complete
row (3 seeds, each one unit); for a row with fewer seeds audited, the seeds' spread,
sd / (mean sqrt(n)), and the row is marked with its seed count (with 2 seeds that spread is
itself a rough estimate).
"""
from __future__ import annotations

from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse
import json
import math
import pathlib
import sys

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import fca_sweep as sweep  # noqa: E402

from dynjax.jsonio import portable_path, publish_json, stamp  # noqa: E402

PAPER_SIZE = {"feature_gate": 76e6, "mudd": 1.4e9}   # FeatureGate 76M, MUDDPythia-1.4B
CONDITIONS = ("cross_input", "token_shuffle", "layer_position_mean", "static_profile")
POINTS = (("tiny", 5000), ("large", 3000))


def parameters(variant: str, size: str) -> int:
    """The sweep's model at that size: parameters counted from its shapes (nothing runs)."""
    from dynjax.models import build
    from dynjax.models.transformer import ModelConfig

    config = sweep.train_config(dict(variant=variant, size=size, steps=1), seed=0)
    model = build(ModelConfig.from_dict(config.model.to_dict()))
    tokens = jax.ShapeDtypeStruct((1, config.data.seq_len), np.int32)
    shapes = jax.eval_shape(model.init, jax.random.key(0), tokens)
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(shapes)))


def point(row: dict, condition: str) -> dict | None:
    """ΔNLL of one row and condition, with its log-scale standard error and seed count."""
    if row["audit"] is not None and condition in row["audit"]["conditions"]:
        c = row["audit"]["conditions"][condition]
        return {"estimate": c["estimate"], "seeds": row["audit"]["units"],
                "se_log": (math.log(c["ci_high"]) - math.log(c["ci_low"])) / 3.92,
                "from": "95% CI of the row's audit (seeds as units)"}
    seeds = [a["conditions"][condition]["estimate"]
             for a in (row.get("seed_audits") or {}).values() if condition in a["conditions"]]
    if len(seeds) < 2:
        return None
    mean = float(np.mean(seeds))
    return {"estimate": mean, "seeds": len(seeds), "per_seed": seeds,
            "se_log": float(np.std(seeds, ddof=1) / (mean * math.sqrt(len(seeds)))),
            "from": "spread of the seeds audited so far (row incomplete)"}


def slopes(results: dict, params: dict) -> dict:
    rows = {(r["variant"], r["size"], r["steps"]): r for r in results["rows"]}
    out = {}
    for variant in ("feature_gate", "mudd"):
        for condition in CONDITIONS:
            pts = [point(rows[(variant, s, n)], condition) if (variant, s, n) in rows else None
                   for s, n in POINTS]
            if None in pts:
                continue
            (a, b), (pa, pb) = pts, (params[variant][s] for s, _ in POINTS)
            dx = math.log(pb) - math.log(pa)
            slope = (math.log(b["estimate"]) - math.log(a["estimate"])) / dx
            se = math.hypot(a["se_log"], b["se_log"]) / dx
            target = PAPER_SIZE[variant]
            paper = results["paper"][variant]["conditions"].get(condition) \
                if "paper" in results and variant in results["paper"] else None
            predicted = b["estimate"] * (target / pb) ** slope
            spread = math.log(target / pb)
            out[f"{variant}/{condition}"] = {
                "points": {f"{s}_{n}": dict(p, parameters=params[variant][s])
                           for (s, n), p in zip(POINTS, pts)},
                "slope": slope, "slope_se": se,
                "slope_ci95": [slope - 1.96 * se, slope + 1.96 * se],
                "prediction": {"parameters": target, "delta_nll": predicted,
                               "range95": [b["estimate"] * math.exp(spread * (slope - 1.96 * se)),
                                           b["estimate"] * math.exp(spread * (slope + 1.96 * se))],
                               "paper": paper}}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=str(ROOT / "results" / "fca_sweep" / "results.json"))
    ap.add_argument("--out", default=str(ROOT / "results" / "fca_sweep" / "size_slope.json"))
    args = ap.parse_args(argv)
    results = json.loads(pathlib.Path(args.results).read_text())
    params = {v: {s: parameters(v, s) for s, _ in POINTS} for v in ("feature_gate", "mudd")}
    res = {**stamp(), "source": portable_path(args.results), "parameters": params,
           "note": __doc__.split("\n\n", 2)[2].strip(), "slopes": slopes(results, params)}
    publish_json(res, args.out, indent=2)


if __name__ == "__main__":
    main()
