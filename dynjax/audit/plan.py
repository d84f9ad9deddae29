"""The memory and time an audit of a large checkpoint needs, from its config alone.

Printed before an HF directory's audit runs, so a user sees what a real checkpoint needs
before any weights load. The forward counts follow the engine (record every calibration and
evaluation window; replay each evaluation window once per deterministic condition and once
per reassignment of each randomized one); the FLOPs are the model's analytic count per window.
"""
from __future__ import annotations

from dynjax.audit import interventions
from dynjax.audit.engine import keys_per_chunk


def audit_plan(model: dict, est: dict, n_calib: int, n_eval: int, seq_len: int, settings,
               flops_per_second=None, tables: int = 1) -> dict:
    """``est``: the model's ``param_bytes``, ``coeff_cache_bytes`` (the evaluation windows'
    coefficients), ``activation_bytes_per_batch`` and ``record_flops_per_window`` /
    ``replay_flops_per_window``; ``model``: what the plan's first line shows; ``tables``:
    the condition tables run on the one recording (1 + the coefficient families audited
    apart; an upper bound, as a family skips the conditions that do not apply to it)."""
    rows = min(settings.batch_size, n_calib, n_eval)
    n_rand = sum(interventions.REGISTRY[c].randomized for c in settings.conditions)
    n_det = sum(not interventions.REGISTRY[c].randomized for c in settings.conditions) - 1
    replays = n_eval * (1 + tables * (n_det + n_rand * settings.reassignments))
    calib_cache = est["coeff_cache_bytes"] * n_calib // max(n_eval, 1)
    per = keys_per_chunk(settings.reassignments, est["coeff_cache_bytes"] * max(n_rand, 1),
                         settings.max_reassign_bytes)
    plan = {
        "model": model,
        "windows": {"calibration": n_calib, "evaluation": n_eval, "seq_len": seq_len,
                    "rows_per_forward": rows},
        "forward_windows": {"record": n_eval + n_calib, "replay": replays},
        "bytes": {"params": est["param_bytes"],
                  "coeff_cache_eval_plus_calib": est["coeff_cache_bytes"] + calib_cache,
                  "reassigned_copies": per * n_rand * est["coeff_cache_bytes"],
                  "activations_per_batch": est["activation_bytes_per_batch"]},
        "flops": (est["record_flops_per_window"] * (n_eval + n_calib)
                  + est["replay_flops_per_window"] * replays),
    }
    plan["bytes"]["peak_device_estimate"] = (
        est["param_bytes"] + plan["bytes"]["coeff_cache_eval_plus_calib"]
        + plan["bytes"]["reassigned_copies"] + 2 * est["activation_bytes_per_batch"])
    if tables > 1:
        plan["condition_tables"] = tables
    if flops_per_second:
        plan["seconds_estimate"] = plan["flops"] / float(flops_per_second)
    return plan


def format_plan(plan: dict, what: str, section: str) -> str:
    """The plan in lines; ``what`` names the model, ``section`` the config section whose
    ``flops_per_second`` gives a time."""
    gb = lambda b: f"{b / 2**30:.2f} GiB"
    m = plan["model"]
    count = lambda n: f"{n / 1e9:.3f}B" if n >= 1e8 else f"{n:,}"
    lines = [f"{what} audit plan: {m['n_layer']} layers, dim {m['dim']}, "
             f"{count(m['params'])} params" + (f" ({count(m['active_params'])} active per "
                                               "token)" if "active_params" in m else "")
             + f", {m['dtype']}",
             f"  windows: {plan['windows']['calibration']} calibration + "
             f"{plan['windows']['evaluation']} evaluation x {plan['windows']['seq_len']} tokens, "
             f"{plan['windows']['rows_per_forward']} rows per forward",
             f"  forwards (windows): record {plan['forward_windows']['record']}, "
             f"replay {plan['forward_windows']['replay']}"
             + (f" ({plan['condition_tables']} condition tables: all families, then each)"
                if plan.get("condition_tables", 1) > 1 else "")
             + f"; {plan['flops']:.3g} FLOP"]
    lines += [f"  {k.replace('_', ' ')}: {gb(v)}" for k, v in plan["bytes"].items()]
    if "seconds_estimate" in plan:
        lines.append(f"  time at the given FLOP/s: {plan['seconds_estimate'] / 60:.1f} min")
    else:
        lines.append(f"  time: set --config.{section}.flops_per_second for an estimate")
    return "\n".join(lines)
