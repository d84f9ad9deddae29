"""Compiled against analytic forward FLOPs for every family and variant, one table.

    .venv/bin/python benchmarks/flop_agreement.py [--out results/flop_agreement.json]

XLA's cost analysis of the unrolled forward (every op) beside dynjax's analytic count
(matmuls and controllers, ``dynjax.measure.lm_execution``), at d_model=256, 2 layers, T=64.
The ratio is what a FLOP claim can trust: tests hold every case to within 5%.
"""
from __future__ import annotations

from dynjax.runtime import describe, setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse
import json

from dynjax.measure import lm_execution  # noqa: E402
from dynjax.models.transformer import ModelConfig  # noqa: E402
from dynjax.jsonio import command_line, write_json_atomic  # noqa: E402

SIZE = dict(d_model=256, n_heads=4, n_layers=2, d_ff=1024, scan_layers=False)
BATCH, SEQ = 1, 64
CAUSAL = dict(mod_route="router", moe_priority="position")
CASES = {
    "gates/dense": dict(family="gates", variant="dense"),
    "gates/layer_static": dict(family="gates", variant="layer_static"),
    "gates/feature_gate": dict(family="gates", variant="feature_gate"),
    "gates/fixed_depth1": dict(family="gates", variant="fixed_depth", fixed_depth=1),
    "mod/dense": dict(family="mod", variant="dense"),
    "mod/mod topk": dict(family="mod", variant="mod"),
    "mod/mod predictor (causal)": dict(family="mod", variant="mod", mod_route="predictor"),
    "mod/mod router, 16 slots": dict(family="mod", variant="mod", mod_decode_slots=16, **CAUSAL),
    "mod/mode_staged topk": dict(family="mod", variant="mode_staged"),
    "mod/mode_staged router, 16 slots": dict(family="mod", variant="mode_staged",
                                            mod_decode_slots=16, **CAUSAL),
    "moe/moe top-1": dict(family="moe", variant="moe"),
    "moe/moe top-2": dict(family="moe", variant="moe", moe_num_experts_per_tok=2),
    "moe/moe expert_choice": dict(family="moe", variant="moe", moe_routing="expert_choice"),
    "moe/mode_integrated": dict(family="moe", variant="mode_integrated"),
    "mudd/mudd": dict(family="mudd", variant="mudd"),
    "mudd/mudd_static": dict(family="mudd", variant="mudd_static"),
}


def agreement(name: str) -> dict:
    cfg = ModelConfig.from_dict({**SIZE, **CASES[name]})
    r = lm_execution.flop_report(cfg, BATCH, SEQ)
    return {"compiled_flops": r["compiled_flops"], "analytic_flops": r["analytic_flops"],
            "ratio": r["compiled_flops"] / r["analytic_flops"],
            "analytic_parts": r["analytic_parts"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results/flop_agreement.json")
    args = ap.parse_args()
    rows = {name: agreement(name) for name in CASES}
    write_json_atomic(args.out, {"command": command_line(), "runtime": describe(),
                                 "size": SIZE, "batch": BATCH, "seq_len": SEQ,
                                 "compiled": "XLA cost analysis, unrolled layers, all ops",
                                 "analytic": "matmuls and controllers, 2 x MACs",
                                 "cases": rows})
    print("| family / variant | compiled GFLOP | analytic GFLOP | compiled / analytic |")
    print("|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['compiled_flops'] / 1e9:.4f} | {r['analytic_flops'] / 1e9:.4f} "
              f"| {r['ratio']:.3f} |")
    print(json.dumps({n: round(r["ratio"], 4) for n, r in rows.items()}))


if __name__ == "__main__":
    main()
