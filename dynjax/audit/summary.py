"""Statistics: per-checkpoint audits in, the results dict that report.py writes out.

Everything inferential, apart from the engine that produces the numbers: CIs over
checkpoints or over windows, sign-flip p-values, retention, the prespecified criteria and
the 2x2 factorial effects with Holm.
"""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from dynjax.audit import interventions, stats
from dynjax.audit.settings import LM, Settings, Task, not_applicable_row, reassignment_keys
from dynjax.coeffs import is_axes

RANDOMIZED_2X2 = ("cross_input", "token_shuffle", "cross_shuffle")
EFFECTS = ("E_input", "E_token", "E_interaction")


def condition_labels(schema) -> dict:
    """Display names: the paper's LayerMean / GlobalMean for gates, StaticMixMean /
    SourceUniformMean where coefficients mix source layers (MUDD)."""
    mixing = any("source" in ax for ax in jax.tree.leaves(schema, is_leaf=is_axes))
    labels = {name: c.label for name, c in interventions.CONDITIONS.items()}
    labels["static_profile"] = "StaticMixMean" if mixing else "LayerMean"
    labels["structure_removed"] = "SourceUniformMean" if mixing else "GlobalMean"
    return labels


def _constant_summary(value, n, unit, level):
    return {"estimate": float(value), "ci_low": float(value), "ci_high": float(value),
            "level": level, "n": n, "unit": unit, "ci_method": "degenerate", "p": np.nan,
            "p_method": "", "note": "all values equal"}


def _summarize(values, single: bool, s: Settings) -> dict:
    """Per-checkpoint means (several checkpoints) or per-window arrays (one checkpoint)."""
    x = np.asarray(values, np.float64)
    unit = stats.UNIT_WINDOWS if single else stats.UNIT_CHECKPOINT
    n = x.shape[-1] if single else x.size
    if x.size and np.ptp(x) == 0:   # e.g. Correct, or a constant controller: CI [v, v]
        out = _constant_summary(x.flat[0], n, unit, s.level)
        test = stats.sign_flip_test(x.reshape(-1, n).mean(axis=0), seed=s.stats_seed)
        out.update(p=test["p"], p_method=test["method"])
        if "p_floor" in test:
            out["p_floor"] = test["p_floor"]
        return out
    if single:
        return stats.summarize_windows(x, level=s.level, seed=s.stats_seed,
                                       n_resamples=s.n_resamples)
    return stats.summarize_checkpoints(x, level=s.level, seed=s.stats_seed,
                                       n_resamples=s.n_resamples)


def _retention(static, ref, single: bool, s: Settings) -> dict:
    with np.errstate(divide="ignore", invalid="ignore"):
        if single:
            return stats.retention_ci(static, ref, level=s.level, seed=s.stats_seed,
                                      unit=stats.UNIT_WINDOWS, method="percentile",
                                      n_resamples=s.n_resamples)
        return stats.retention_ci(static, ref, level=s.level, seed=s.stats_seed,
                                  n_resamples=s.n_resamples)


def summarize(checkpoints: Sequence[dict], settings: Settings, schema) -> dict:
    """Combine per-checkpoint audits into the report's ``conditions`` / ``effects`` sections.

    Several checkpoints: each is one unit (checkpoint-level bootstrap CI, exact sign flips).
    One checkpoint: intervals over evaluation windows and reassignments, and ``unit`` says so.
    """
    s = settings
    single = len(checkpoints) == 1
    labels = condition_labels(schema)

    def unit_values(name):
        """(W,) or (R, W) per-window arrays for one checkpoint; else per-checkpoint means."""
        if single:
            return checkpoints[0]["delta"][name]
        return np.array([c["delta"][name].mean() for c in checkpoints])

    def window_means(name):  # reassignment-averaged per window: paired across conditions
        d = checkpoints[0]["delta"][name]
        return d.mean(axis=0) if d.ndim == 2 else d

    conditions = {}
    for name in s.conditions:
        row = _summarize(unit_values(name), single, s)
        row["label"] = labels.get(name, name)
        row["per_unit"] = [float(c["delta"][name].mean()) for c in checkpoints]
        conditions[name] = row

    ref = "structure_removed"
    for name in ("static_profile", "layer_position_mean"):
        if name in conditions and ref in conditions:
            if single:
                conditions[name]["retention"] = _retention(window_means(name),
                                                           window_means(ref), True, s)
            else:
                conditions[name]["retention"] = _retention(unit_values(name),
                                                           unit_values(ref), False, s)
    if "static_profile" in conditions:
        row = conditions["static_profile"]
        verdicts = {"practically_small": stats.practically_small(row, s.criteria)}
        if "retention" in row:
            v = stats.high_retention(row["retention"], s.criteria)
            if not conditions[ref]["estimate"] > 0:   # no gap to retain: no verdict
                v = dict(v, met=None, note="the reference ΔNLL is not positive")
            verdicts["high_retention"] = v
        row["verdicts"] = verdicts

    effects = {}
    if all(n in s.conditions for n in RANDOMIZED_2X2):
        if single:
            d = checkpoints[0]["delta"]
            e = stats.factorial_effects(0.0, d["cross_input"], d["token_shuffle"],
                                        d["cross_shuffle"])   # paired per (reassignment, window)
        else:
            e = stats.factorial_effects(0.0, *(unit_values(n) for n in RANDOMIZED_2X2))
        for name in EFFECTS:
            effects[name] = _summarize(e[name], single, s)
            effects[name]["per_unit"] = (
                [float(np.mean(e[name]))] if single else [float(v) for v in e[name]])
        holm = stats.holm([effects[n]["p"] for n in EFFECTS])
        for name, p in zip(EFFECTS, holm):
            effects[name]["p_holm"] = float(p)
            effects[name]["p_holm_method"] = "Holm over the three factorial effects " \
                "(statsmodels multipletests, method='holm')"
    out = {"unit": stats.UNIT_WINDOWS if single else stats.UNIT_CHECKPOINT,
           "conditions": conditions, "effects": effects}
    if not single and (warning := stats.small_n_warning(len(checkpoints))):
        out["small_n_warning"] = warning
    return out


def _mean_dicts(dicts):
    """Element-wise mean of nested dicts of numbers (variance shares across checkpoints)."""
    first = dicts[0]
    if isinstance(first, dict):
        return {k: _mean_dicts([d[k] for d in dicts]) for k in first}
    return float(np.mean([np.nan if v is None else v for v in dicts]))


def assemble_results(title: str, checkpoints: Sequence[dict], infos: Sequence[dict],
                     settings: Settings, schema, meta: dict, not_applicable: dict | None = None,
                     task: Task = LM) -> dict:
    """The full results dict (report.write_report's format) from per-checkpoint audits.

    ``infos``: one dict per checkpoint (name, run dir, step, params sha256, ...).
    ``not_applicable``: conditions skipped (see :func:`applicable`), each a row without
    numbers; the factorial effects, which need them, are rows without numbers too.
    """
    res = summarize(checkpoints, settings, schema)
    if not_applicable:
        labels = condition_labels(schema)
        rows = dict(res["conditions"], **{n: not_applicable_row(why, labels.get(n, n))
                                          for n, why in not_applicable.items()})
        res["conditions"] = {n: rows[n] for n in interventions.CONDITIONS if n in rows}
        missing = [n for n in RANDOMIZED_2X2 if n in not_applicable]
        if missing and not res["effects"]:
            why = f"the 2x2 factorial needs {' and '.join(missing)}, not applicable here"
            res["effects"] = {n: not_applicable_row(why, n) for n in EFFECTS}
    replays = [c["replay"] for c in checkpoints]
    dl = [r["max_abs_dlogit"] for r in replays]
    results = {
        "title": title,
        "unit": res["unit"],
        "loss": task.description,
        "replay": {"exact": all(r["exact"] for r in replays),
                   "max_abs_dlogit": float(np.max(dl)),
                   "nll": float(np.mean([r["nll"] for r in replays])),
                   "nll_replay": float(np.mean([r["nll_replay"] for r in replays])),
                   "per_checkpoint": replays},
        "conditions": res["conditions"],
        "effects": res["effects"],
    }
    results["replay"]["atol"] = settings.replay_atol
    if "small_n_warning" in res:
        results["small_n_warning"] = res["small_n_warning"]
    if settings.variance:
        results["variance"] = _mean_dicts([c["variance"] for c in checkpoints])
    profs = [c.get("profiles") for c in checkpoints]
    if profs[0] is not None and all(p is not None and np.shape(p["heatmap"]) ==
                                    np.shape(profs[0]["heatmap"]) for p in profs):
        heat = np.mean([p["heatmap"] for p in profs], axis=0)
        results["profiles"] = {"heatmap": heat, "layer_mean": heat.mean(axis=1),
                               "global_mean": float(np.mean([p["global_mean"] for p in profs]))}
    keys = reassignment_keys(settings.seed, settings.reassignments)
    per_ckpt = []
    for info, c in zip(infos, checkpoints):
        entry = dict(info)
        entry.update(replay=c["replay"], constant_along=c.get("constant_along", {}),
                     nll_record=float(c["nll_record"].mean()),
                     nll_correct=float(c["nll_correct"].mean()),
                     delta_nll={n: float(d.mean()) for n, d in c["delta"].items()},
                     forwards=c["forwards"], rows_per_forward=c["rows_per_forward"],
                     seconds=c["seconds"])
        if settings.variance:
            entry["variance"] = c["variance"]
        if settings.per_window:
            entry["per_window"] = {"nll_correct": c["nll_correct"],
                                   "delta_nll": dict(c["delta"])}
        per_ckpt.append(entry)
    results["meta"] = {
        **meta,
        "settings": settings.to_dict(),
        "task": task.name,
        "not_applicable": dict(not_applicable or {}),
        "seeds": {"reassignment_seed": settings.seed,
                  "key_derivation": "jax.random.split(jax.random.key(seed), reassignments)[r]",
                  "prng_impl": str(jax.config.jax_default_prng_impl),
                  "key_data": np.asarray(jax.random.key_data(keys)),
                  "bootstrap_seed": settings.stats_seed},
        "checkpoints": per_ckpt,
        "versions": {"jax": jax.__version__, "backend": jax.default_backend(),
                     "device": jax.devices()[0].device_kind},
    }
    return results


def summarize_stored(results: dict) -> dict | None:
    """The ``conditions`` / ``effects`` sections recomputed from a results.json's stored
    per-checkpoint values (per-window ΔNLL where kept, else, with several checkpoints, each
    checkpoint's mean ΔNLL, which is all the checkpoint-level statistics read) and its
    settings; None for a single checkpoint whose per-window values were not kept."""
    meta = results["meta"]
    cfg = dict(meta["settings"])
    cfg["criteria"] = stats.Criteria(**cfg["criteria"])
    settings = Settings(**cfg)
    ckpts = meta["checkpoints"]
    if all("per_window" in c for c in ckpts):
        delta = [c["per_window"]["delta_nll"] for c in ckpts]
    elif len(ckpts) > 1:
        delta = [{n: [v] for n, v in c["delta_nll"].items()} for c in ckpts]
    else:
        return None
    units = [{"delta": {n: np.asarray(v, np.float64) for n, v in d.items()
                        if n in settings.conditions}} for d in delta]
    return summarize(units, settings, {})
