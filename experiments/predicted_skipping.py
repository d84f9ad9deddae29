"""Skipping that shows on the clock: FeatureGate blocks run only for predicted tokens.

    .venv/bin/python experiments/predicted_skipping.py /work/runs/tiny_feature_gate \
        --mod /work/runs/mod_isoflop_causal/mod_s0 [--windows 128] [--out results/skipping]

On a frozen FeatureGate checkpoint, for each tau (quantiles of the gates recorded on
training windows): fit one pre-block predictor per block to "gate >= tau"
(``dynjax.measure.skip_predictors``), give each block a fixed capacity, and run
``dynjax.decoding.predicted_skip``: test bits/byte, the fraction of (block, token) executions, analytic FLOPs,
prefill latency (batch 8) and per-token decode latency (batch 1, teacher forcing), all
timers interleaved in one run. Against: the plain forward, the same checkpoint truncated to
its first K blocks (FixedDepthK on it), and a MoD model of the same size under causal
predictor routing with a budget of floor(c T) slots per MoD block (its fixed-capacity
program). Writes OUT/predicted_skipping.json (with the command), atomically.
"""
from __future__ import annotations

from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse
import time
from pathlib import Path

import numpy as np

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from dynjax import decoding  # noqa: E402
from dynjax.runs import rundir  # noqa: E402
from dynjax.decoding import predicted_skip  # noqa: E402
from dynjax.data import text  # noqa: E402
from dynjax.measure import latency, update_removal  # noqa: E402
from dynjax.measure import skip_predictors as ps  # noqa: E402
from dynjax.measure.lm_execution import analytic_forward_flops  # noqa: E402
from dynjax.models import build, mod  # noqa: E402
from dynjax.models.transformer import next_token_nll  # noqa: E402
from dynjax.jsonio import portable_path, stamp, write_json_atomic  # noqa: E402

REMOVE = (0.05, 0.1, 0.25, 0.5)  # fractions of recorded gates below tau


def data(config, n_test: int, n_fit: int, seed: int = 123):
    dc = config.data
    splits = text.load_splits(dc.source, dc.get("path"), dc.get("tfds_name"), dc.get("data_dir"))
    fit = text.train_batch(splits["train"], dc.seq_len, n_fit, seed, 0)
    return fit, text.eval_windows(splits["test"], dc.seq_len, n_test)


def truncated(model, params, depth: int):
    """The checkpoint's first ``depth`` blocks as a model of that depth (unrolled layers)."""
    cfg = model.cfg.replace(n_layers=depth)
    layers = {f"layer_{i}": params["layers"][f"layer_{i}"] for i in range(depth)}
    return build(cfg), dict(params, layers=layers)


def bpb_of(model, params, windows, batch_size=32) -> float:
    fwd = jax.jit(lambda p, t: next_token_nll(model.apply(p, t)[0], t).mean(-1).sum())
    nll = sum(float(fwd(params, jnp.asarray(windows[i:i + batch_size])))
              for i in range(0, len(windows), batch_size))
    return nll / len(windows) / ps.LN2


def mod_arm(run_dir, windows):
    """MoD under causal predictor routing with floor(c T) slots per MoD block."""
    _, model, params = rundir.load_params(run_dir)
    T = windows.shape[1]
    cfg = mod.decode_config(model.cfg, "predictor").replace(
                              mod_decode_slots=mod.capacity(model.cfg, T))
    arm = build(cfg)
    return arm, params, {"run": portable_path(run_dir), "slots": cfg.mod.decode_slots,
                         "bpb": bpb_of(arm, params, windows),
                         "flops": analytic_forward_flops(cfg, 1, T)["total"]}


def at_flops(points, flops):
    """bits/byte linearly interpolated at ``flops`` along points sorted by FLOPs."""
    pts = sorted((p["flops"], p["bpb"]) for p in points)
    xs, ys = zip(*pts)
    return float(np.interp(flops, xs, ys)) if xs[0] <= flops <= xs[-1] else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run")
    ap.add_argument("--mod", required=True)
    ap.add_argument("--windows", type=int, default=128)
    ap.add_argument("--fit-windows", type=int, default=256)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--quantile", type=float, default=0.9)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default="results/skipping")
    args = ap.parse_args()
    t0 = time.time()
    config, model, params = rundir.load_params(args.run)
    cfg, T, hidden = model.cfg, config.data.seq_len, 32
    fit, test = data(config, args.windows, args.fit_windows)
    h_fit, g_fit = ps.record(cfg, params, fit)
    recorded = ps.record(cfg, params, test)
    dense_flops = analytic_forward_flops(cfg, 1, T)["total"]

    arms, predictors = [], {}
    for frac in REMOVE:
        tau = float(np.quantile(g_fit, frac))
        pred, loss = ps.fit_predictor(h_fit, g_fit, tau, hidden, args.steps)
        slots = ps.capacity_slots(ps.asked_counts(cfg, pred, h_fit), T, args.quantile)
        r = ps.evaluate(cfg, params, pred, slots, test, tau, recorded=recorded)
        r.update(removed_target=frac, fit_bce=loss.tolist(),
                 flops=ps.skip_flops(cfg, T, slots, hidden)["total"])
        r["flops_ratio"] = r["flops"] / dense_flops
        arms.append(r)
        predictors[f"skip_tau{frac}"] = (pred, slots)
        print(f"tau {tau:.3f}: bpb {r['bpb']:.4f} executed {r['executed']:.3f} "
              f"overflow {r['overflow']:.3f} slots {slots} flops {r['flops_ratio']:.3f}",
              flush=True)

    curves = update_removal.skipping_curves(model, params, test, [0.0])
    trunc = [{"depth": p["depth"], "bpb": p["bpb"],
              "flops": analytic_forward_flops(cfg.replace(n_layers=p["depth"]),
                                              1, T)["total"]} for p in curves["truncate"]]
    mod_model, mod_params, mod_point = mod_arm(args.mod, test)

    # Prefill: one batch-8 window pass of each program, in turns.
    tokens = jnp.asarray(test[:8])
    timers = {"plain": latency.forward_timer(model, params, tokens),
              "skip_all": (lambda f: lambda: f(params, tokens))(
                  jax.jit(lambda p, t: predicted_skip.forward(cfg, p, None, t)[0]))}
    for name, (pred, slots) in predictors.items():
        f = jax.jit(lambda p, pr, t, s=tuple(slots): predicted_skip.forward(cfg, p, pr, t, s)[0])
        timers[name] = (lambda f, pr: lambda: f(params, pr, tokens))(f, pred)
    for k in range(1, cfg.n_layers):
        timers[f"first{k}"] = latency.forward_timer(*truncated(model, params, k), tokens)
    timers["mod"] = latency.forward_timer(mod_model, mod_params, tokens)
    prefill = latency.paired_times(timers, args.repeats)
    load_prefill = latency.load_average()

    # Decode: one test window token by token (batch 1), per-token seconds.
    one = jnp.asarray(test[8:9])
    dec = {"plain": jax.jit(lambda p, t: decoding.cached_forward(cfg, p, t)[0]),
           "mod": jax.jit(lambda p, t: decoding.cached_forward(mod_model.cfg, p, t)[0])}
    dtimers = {"plain": lambda: dec["plain"](params, one),
               "mod": lambda: dec["mod"](mod_params, one)}
    for name, (pred, slots) in predictors.items():
        f = jax.jit(lambda p, pr, t: predicted_skip.cached_forward(cfg, p, pr, t)[0])
        dtimers[name] = (lambda f, pr: lambda: f(params, pr, one))(f, pred)
    decode = {k: {kk: v / T for kk, v in t.items() if kk != "repeats"}
              for k, t in latency.paired_times(dtimers, max(3, args.repeats // 3)).items()}

    for r, name in zip(arms, predictors):
        r["prefill_ratio"] = prefill[name]["median_s"] / prefill["plain"]["median_s"]
        r["decode_ratio"] = decode[name]["median_s"] / decode["plain"]["median_s"]
    for p in trunc:
        key = f"first{p['depth']}"
        if key in prefill:
            p["prefill_ratio"] = prefill[key]["median_s"] / prefill["plain"]["median_s"]
    mod_point["prefill_ratio"] = prefill["mod"]["median_s"] / prefill["plain"]["median_s"]
    mod_point["decode_ratio"] = decode["mod"]["median_s"] / decode["plain"]["median_s"]
    mod_point["flops_ratio"] = mod_point["flops"] / dense_flops
    out = {
        **stamp(),
        "run": portable_path(args.run), "test_windows": args.windows, "fit_windows": args.fit_windows,
        "predictor": {"hidden": hidden, "steps": args.steps, "capacity_quantile":
                      args.quantile},
        "plain": {"bpb": curves["plain_bpb"], "flops": dense_flops},
        "predicted_skipping": arms, "first_k_blocks": trunc, "mod": mod_point,
        "at_mod_flops": {"predicted_skipping": at_flops(arms + [
            {"flops": dense_flops, "bpb": curves["plain_bpb"]}], mod_point["flops"]),
                         "first_k_blocks": at_flops(trunc, mod_point["flops"]),
                         "mod": mod_point["bpb"]},
        "prefill_s_batch8": prefill, "decode_s_per_token_batch1": decode,
        "load_average": {"prefill": load_prefill, "end": latency.load_average()},
        "wall_s": round(time.time() - t0, 1),
        "note": "FLOPs: analytic matmuls per window (dynjax.measure.lm_execution's conventions); "
                "latency ratios are medians of interleaved calls on a shared CPU"}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = f"{args.out}/predicted_skipping.json"
    write_json_atomic(path, out)
    print(f"plain {curves['plain_bpb']:.4f}; MoD {mod_point['bpb']:.4f} at "
          f"{mod_point['flops_ratio']:.3f} FLOPs; at MoD's FLOPs: {out['at_mod_flops']}; "
          f"wrote {path}")


if __name__ == "__main__":
    main()
