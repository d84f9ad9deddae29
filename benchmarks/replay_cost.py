"""What one-program replay costs: FLOPs and times of the audit's record and replay forwards.

    python -m benchmarks.replay_cost [--repeats 15] [--out FILE]    # prints JSON

configs/tiny.py-sized models (d=128, 4 layers, T=128, 16 rows; layers unrolled so
cost_analysis counts every layer) of four families. Since record and replay became one
program (dynjax.coeffs.site) the controller runs in replay too; run this in a checkout from
before that change (7e561ab, where replay skipped the controller and this file ran as a plain
script) and in one after to compare (results/replay_cost.json). FLOPs are exact; times are
medians of interleaved calls (noisy on a shared machine).
"""
from dynjax.runtime import describe, setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse

import jax

from dynjax import coeffs
from dynjax.jsonio import command_line, publish_json
from dynjax.measure.latency import paired_times
from dynjax.models import build

FAMILIES = (("gates", "feature_gate"), ("mudd", "mudd"), ("mod", "mod"), ("moe", "moe"))


def programs(family: str, variant: str):
    """The jitted forward and its record and replay arguments for one tiny model."""
    model = build(dict(family=family, variant=variant, d_model=128, n_heads=4, n_layers=4,
                       d_ff=512, scan_layers=False))
    tokens = jax.random.randint(jax.random.key(1), (16, 128), 0, 256)
    params = model.init(jax.random.key(0), tokens)
    forward = jax.jit(model.apply)
    shapes = jax.eval_shape(lambda p, t: model.apply(p, t)[1], params, tokens)
    record = (params, tokens, coeffs.recording(coeffs.zeros_like(shapes)))
    _, recorded = forward(*record)
    return forward, {"record": record, "replay": (params, tokens, coeffs.replaying(recorded))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out")
    args = ap.parse_args()
    out = {"command": command_line(), "runtime": describe()}
    for family, variant in FAMILIES:
        forward, calls = programs(family, variant)
        times = paired_times({k: (lambda a=a: forward(*a)) for k, a in calls.items()},
                             args.repeats)
        out[f"{family}/{variant}"] = {
            **{f"flops_{k}": forward.lower(*a).compile().cost_analysis()["flops"]
               for k, a in calls.items()},
            **{f"median_s_{k}": t["median_s"] for k, t in times.items()}}
    publish_json(out, args.out, indent=1)


if __name__ == "__main__":
    main()
