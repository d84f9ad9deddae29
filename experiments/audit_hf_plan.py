"""What a routing audit of a real MoE checkpoint needs: memory and FLOPs, from config alone.

    python experiments/audit_hf_plan.py [--out=results/audit_hf_plan.json]

For each MoE of dynjax/loaders/hf_architectures.py (the published config.json fields; nothing is
downloaded), the plan ``audit.py --config=configs/audit_hf.py --hf=DIR`` prints before it
runs, in bfloat16: 64 calibration + 64 evaluation windows of 256 tokens, 8 rows per forward,
20 reassignments of each randomized condition, every condition. ``flops`` counts what each
token reads (its k experts); ``flops_all_experts`` what the port's interim
dense-over-experts path executes (every expert on every token) until the dropless dispatch
replaces it. ``minutes_at_4e14`` divides each by an assumed sustained 4e14 FLOP/s (an
H100-class bfloat16 rate; not measured here).
"""
from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program
setup(__name__)
import argparse  # noqa: E402

RATE = 4e14


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "results/audit_hf_plan.json"))
    args = ap.parse_args()
    from dynjax.configs import audit_hf
    from dynjax import jsonio
    from dynjax.audit.settings import Settings
    from dynjax.loaders import hf
    from dynjax.loaders.hf_architectures import PUBLISHED_FIELDS
    from dynjax.measure import execution
    from dynjax.models import llm
    from dynjax.audit import plan as audit_plan

    config = audit_hf.get_config()
    settings = Settings.from_config(config)
    dc = config.data
    n_calib, n_eval, T = int(dc.calib_windows), int(dc.eval_windows), int(dc.seq_len)
    rows = {}
    for name, fields in PUBLISHED_FIELDS.items():
        cfg = hf.config_from_hf(fields, "bfloat16")
        if not isinstance(cfg, llm.Config):   # DeepSeek-V4: its own family
            print(f"{name:30s} (its own family: plan.py sizes it, results/plan_hf/)")
            continue
        if not cfg.moe_layers:
            continue
        est = execution.llm_estimate(cfg, n_eval, T, min(settings.batch_size, n_calib, n_eval))
        model = {"n_layer": cfg.n_layers, "dim": cfg.hidden_size, "dtype": cfg.dtype,
                 "params": est["param_count"], "active_params": est["active_param_count"]}
        plan = audit_plan.audit_plan(model, est, n_calib, n_eval, T, settings)
        every = execution.llm_flops_per_window(cfg, T, llm.param_count(cfg)["total"])
        windows = plan["forward_windows"]["record"] + plan["forward_windows"]["replay"]
        plan["flops_all_experts"] = every * windows
        plan["minutes_at_4e14"] = {"active": plan["flops"] / RATE / 60,
                                 "all_experts": plan["flops_all_experts"] / RATE / 60}
        rows[name] = plan
        gib = {k: v / 2 ** 30 for k, v in plan["bytes"].items()}
        print(f"{name:30s} peak {gib['peak_device_estimate']:7.1f} GiB (params "
              f"{gib['params']:6.1f}), {plan['flops']:.3g} FLOP active, "
              f"{plan['flops_all_experts']:.3g} all experts; "
              f"{plan['minutes_at_4e14']['active']:.1f} min / "
              f"{plan['minutes_at_4e14']['all_experts']:.1f} min at 4e14 FLOP/s")
    jsonio.write_json_atomic(args.out, {**jsonio.stamp(), "settings": {
        "calibration": n_calib, "evaluation": n_eval, "seq_len": T,
        "reassignments": settings.reassignments, "conditions": list(settings.conditions),
        "dtype": "bfloat16", "assumed_flops_per_second": RATE}, "models": rows})


if __name__ == "__main__":
    main()
