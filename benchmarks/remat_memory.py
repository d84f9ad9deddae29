"""What saving FeatureGate's features under remat buys: the compiled gradient program's
temporary memory and bytes accessed, features saved (``REMAT_SAVED``, the default) against
recomputed in the backward pass, beside the same model without remat. One run, JSON out.

    python benchmarks/remat_memory.py [--d-model 128 --n-layers 4 --seq-len 256 --batch 8]

XLA's memory and cost analyses of the compiled program, not timings: they do not depend on
the load of a shared machine. Gradients of the three programs are compared too.
"""
from dynjax.runtime import describe, setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse

import jax

from dynjax.configs import common  # noqa: E402
from dynjax.models import build, gates  # noqa: E402
from dynjax.models.transformer import next_token_nll  # noqa: E402
from dynjax.jsonio import command_line, publish_json  # noqa: E402


def measure(args, remat: bool, save_features: bool):
    c = common.base("feature_gate")
    c.model.update(d_model=args.d_model, n_heads=args.n_heads, n_layers=args.n_layers,
                   d_ff=4 * args.d_model, scan_layers=True, remat=remat)
    saved_name = gates.REMAT_SAVED
    if not save_features:  # tag the features with a name the remat policy does not keep
        gates.REMAT_SAVED = "not_saved"
    try:
        model = build(c.model.to_dict())
        tokens = jax.random.randint(jax.random.key(1), (args.batch, args.seq_len), 0, 256)
        params = model.init(jax.random.key(0), tokens)
        grad = jax.jit(jax.grad(lambda p: next_token_nll(model.apply(p, tokens)[0],
                                                         tokens).mean()))
        compiled = grad.lower(params).compile()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        return {"temp_bytes": compiled.memory_analysis().temp_size_in_bytes,
                "bytes_accessed": cost.get("bytes accessed"), "flops": cost.get("flops")
                }, grad(params)
    finally:
        gates.REMAT_SAVED = saved_name


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--n-heads", type=int, default=4)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out")
    args = ap.parse_args()
    res, grads = {"command": command_line(), "runtime": describe(), "args": vars(args)}, {}
    for name, remat, save in (("no_remat", False, True), ("remat_features_saved", True, True),
                              ("remat_features_recomputed", True, False)):
        res[name], grads[name] = measure(args, remat, save)
    diff = lambda a, b: max(jax.tree.leaves(jax.tree.map(
        lambda x, y: float(abs(x - y).max()), grads[a], grads[b])))
    res["max_grad_diff_vs_no_remat"] = {n: diff(n, "no_remat") for n in grads if n != "no_remat"}
    saved, recomputed = res["remat_features_saved"], res["remat_features_recomputed"]
    res["saved_over_recomputed"] = {k: saved[k] / recomputed[k]
                                    for k in ("temp_bytes", "bytes_accessed", "flops")}
    publish_json(res, args.out, indent=1)


if __name__ == "__main__":
    main()
