"""The audit's wall time against its lower bound: forward passes x one jitted forward.

    python benchmarks/audit_throughput.py [--variant feature_gate] [--windows 64]
        [--reassignments 20] [--batch-size 64] [--seq-len 128] [--out FILE]
    python benchmarks/audit_throughput.py --hf DIR [--hf-dtype bfloat16] ...   # an HF MoE

Audits a tiny model (configs/tiny.py architecture, initial parameters: the cost does not
depend on training), or with ``--hf DIR`` a Hugging Face checkpoint as ``audit.py --hf``
opens it (``dynjax.audit.targets.hf.HfDir``; e.g. the OLMoE-shaped checkpoint of
``benchmarks/vs_transformers.py``), several times with the same compiled engine: ``cold`` includes
compilation, ``warm`` (median of ``--audit-repeats``) is the steady state. The lower bound is
(number of forward calls) x (median time of one jitted forward of the same batch, timed in
interleaved rounds before and after the warm audits): ``bound_plain`` uses the model's plain
jitted forward, ``bound_programs`` the engine's own record and replay programs.
Ratios are reported for the engine alone (record, replay check, every condition) and for the
whole audit (plus variance decomposition and the statistics). Prints JSON. Aim: warm engine
ratio <= 1.3. These machines are noisy: compare ratios from one run.
"""
from dynjax.runtime import describe, setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp

from dynjax.configs import tiny  # noqa: E402
from dynjax.audit.run import audit_targets  # noqa: E402
from dynjax.audit.settings import Settings  # noqa: E402
from dynjax.data import text  # noqa: E402
from dynjax.measure.latency import paired_medians as median_times  # noqa: E402
from dynjax.models import build  # noqa: E402
from dynjax.jsonio import command_line, publish_json  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", default="feature_gate")
    ap.add_argument("--hf", help="a Hugging Face checkpoint directory instead of --variant")
    ap.add_argument("--hf-dtype", help="its load dtype (default: the checkpoint's)")
    ap.add_argument("--windows", type=int, default=64, help="calibration and evaluation each")
    ap.add_argument("--reassignments", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=10, help="timed calls of each forward")
    ap.add_argument("--audit-repeats", type=int, default=2, help="warm audits (median)")
    ap.add_argument("--replay-atol", type=float, default=0.0,
                    help="> 0 times a model whose replay is not bitwise anyway")
    ap.add_argument("--out")
    args = ap.parse_args()

    splits = text.load_splits()
    calib = text.eval_windows(splits["validation"], args.seq_len, args.windows)
    ev = text.eval_windows(splits["test"], args.seq_len, args.windows)
    settings = Settings(reassignments=args.reassignments, batch_size=args.batch_size,
                        replay_atol=args.replay_atol)
    if args.hf:   # the byte-level windows are valid token ids of any vocabulary >= 256
        from dynjax.audit.targets.hf import HfDir
        opened = HfDir(args.hf, {"hf": {"dtype": args.hf_dtype}} if args.hf_dtype else None)
        target = {**opened.audit_target(), "engine_key": "bench"}
        model, params = opened.model, target["params"]
        args.variant = f"hf/{opened.cfg.model_type}/{opened.cfg.dtype}"
    else:
        config = tiny.get_config(args.variant)
        model = build(config.model.to_dict())
        params = model.init(jax.random.key(0), jnp.asarray(ev[:1]))
        target = {"apply_fn": model.apply, "schema": model.schema, "params": params,
                  "info": {"name": args.variant}, "engine_key": "bench"}
    engines = {}

    batch = jnp.asarray(ev[:min(args.batch_size, args.windows)])
    plain = jax.jit(lambda p, t: model.apply(p, t)[0])

    def forward_times():
        engine = next(iter(engines.values()))
        _, _, coeffs = engine.record_fn(params, batch)
        return median_times({"plain": lambda: plain(params, batch),
                             "record": lambda: engine.record_fn(params, batch),
                             "replay": lambda: engine.replay_fn(params, batch, coeffs)},
                            args.repeats)

    walls = {}
    for phase in ["cold"] + [f"warm{i}" for i in range(args.audit_repeats)]:
        t0 = time.perf_counter()
        res = audit_targets([target], calib, ev, settings, "bench", progress=False,
                            engines=engines)
        walls[phase] = {"audit": time.perf_counter() - t0,
                        "engine": res["meta"]["checkpoints"][0]["seconds"]["total"]}
        if phase == "cold":
            before = forward_times()
    after = forward_times()
    t = {k: (before[k] + after[k]) / 2 for k in before}   # bracket the warm audits
    warm = {k: statistics.median(w[k] for p, w in walls.items() if p != "cold")
            for k in ("audit", "engine")}
    (engine,) = engines.values()
    forwards = res["meta"]["checkpoints"][0]["forwards"]
    n_fwd = sum(forwards.values())
    t_plain, t_record, t_replay = t["plain"], t["record"], t["replay"]
    bound_plain = n_fwd * t_plain
    bound_programs = forwards.get("record", 0) * t_record + forwards.get("replay", 0) * t_replay

    out = {
        "command": command_line(), "runtime": describe(),
        "load_average_after": os.getloadavg(),
        "backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
        "variant": args.variant, "seq_len": args.seq_len, "rows_per_forward": engine.rows,
        "windows": args.windows, "reassignments": args.reassignments,
        "forward_calls": forwards,
        "replay": {k: res["replay"][k] for k in ("exact", "max_abs_dlogit")},
        "seconds": {"one_forward_plain": t_plain, "one_record": t_record,
                    "one_replay": t_replay, "bound_plain": bound_plain,
                    "bound_programs": bound_programs, "warm_audit_median": warm["audit"],
                    "warm_engine_median": warm["engine"],
                    **{f"{k}_{p}": v for p, w in walls.items() for k, v in w.items()}},
        "ratio": {
            "warm_engine_vs_plain": warm["engine"] / bound_plain,
            "warm_engine_vs_programs": warm["engine"] / bound_programs,
            "warm_audit_vs_plain": warm["audit"] / bound_plain,
            "cold_audit_vs_plain": walls["cold"]["audit"] / bound_plain,
        },
    }
    publish_json(out, args.out, indent=1)


if __name__ == "__main__":
    main()
