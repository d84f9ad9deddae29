"""Statistics: per-checkpoint audits in, the results dict that report.py writes out.

Everything inferential, apart from the engine that produces the numbers: CIs over
checkpoints or over windows, sign-flip p-values, retention, the prespecified criteria and
the 2x2 factorial effects with Holm.
"""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from dynjax import jsonio
from dynjax.audit import interventions, stats
from dynjax.audit.settings import Settings, not_applicable_row, reassignment_keys
from dynjax.coeffs import is_axes
from dynjax.errors import AuditError
from dynjax.tasks import LM, Task

RANDOMIZED_2X2 = ("cross_input", "token_shuffle", "cross_shuffle")
EFFECTS = ("E_input", "E_token", "E_interaction")


def condition_labels(schema) -> dict:
    """Display names: the paper's LayerMean / GlobalMean for gates, StaticMixMean /
    SourceUniformMean where coefficients mix source layers (MUDD)."""
    mixing = any("source" in ax for ax in jax.tree.leaves(schema, is_leaf=is_axes))
    labels = {name: c.label for name, c in interventions.REGISTRY.items()}
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
                     task: Task = LM, families: dict | None = None) -> dict:
    """The full results dict (report.write_report's format) from per-checkpoint audits.

    ``infos``: one dict per checkpoint (name, run dir, step, params sha256, ...).
    ``not_applicable``: conditions skipped (see :func:`applicable`), each a row without
    numbers; the factorial effects, which need them, are rows without numbers too.
    ``families``: ``{name: (keys, Settings, not_applicable)}`` of the families audited apart
    (each checkpoint's ``"families"``): ``results["families"][name]`` is that family's own
    ``conditions`` / ``effects`` table over its leaves ``keys``.
    """
    labels = condition_labels(schema)
    res = _with_not_applicable(summarize(checkpoints, settings, schema), not_applicable, labels)
    fam_tables = {}
    for fam, (keys, fam_settings, fam_skipped) in (families or {}).items():
        fam_schema = {k: schema[k] for k in keys}
        fam_labels = condition_labels(fam_schema)
        units = [c["families"][fam] for c in checkpoints]
        table = _with_not_applicable(summarize(units, fam_settings, fam_schema), fam_skipped,
                                     fam_labels)
        fam_tables[fam] = {"sites": list(keys), "conditions": table["conditions"],
                           "effects": table["effects"],
                           "not_applicable": dict(fam_skipped)}
    entries = []
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
        if c.get("families"):
            entry["families"] = {
                fam: {"delta_nll": {n: float(d.mean()) for n, d in f["delta"].items()},
                      "constant_along": f["constant_along"],
                      **({"per_window": {"delta_nll": dict(f["delta"])}}
                         if settings.per_window else {})}
                for fam, f in c["families"].items()}
        entries.append(entry)
    keys = reassignment_keys(settings.seed, settings.reassignments)
    meta = {
        **meta,
        "settings": settings.to_dict(),
        "task": task.name,
        "not_applicable": dict(not_applicable or {}),
        "seeds": {"reassignment_seed": settings.seed,
                  "key_derivation": "jax.random.split(jax.random.key(seed), reassignments)[r]",
                  "prng_impl": str(jax.config.jax_default_prng_impl),
                  "key_data": np.asarray(jax.random.key_data(keys)),
                  "bootstrap_seed": settings.stats_seed},
        "versions": {**jsonio.versions(), "jax": jax.__version__,
                     "backend": jax.default_backend(),
                     "device": jax.devices()[0].device_kind},
    }
    profiles = _pooled_profiles([(c.get("profiles"), 1) for c in checkpoints])
    results = _results(title, res, entries, settings, task.description, profiles, meta)
    if fam_tables:
        results["families"] = fam_tables
    return results


def _with_not_applicable(res: dict, not_applicable: dict | None, labels: dict) -> dict:
    """``summarize``'s sections with a numberless row for each condition skipped, and for
    the factorial effects when they need one of those."""
    if not not_applicable:
        return res
    rows = dict(res["conditions"], **{n: not_applicable_row(why, labels.get(n, n))
                                      for n, why in not_applicable.items()})
    res = dict(res, conditions={n: rows[n] for n in interventions.REGISTRY if n in rows})
    missing = [n for n in RANDOMIZED_2X2 if n in not_applicable]
    if missing and not res["effects"]:
        why = f"the 2x2 factorial needs {' and '.join(missing)}, not applicable here"
        res["effects"] = {n: not_applicable_row(why, n) for n in EFFECTS}
    return res


def _pooled_profiles(weighted) -> dict | None:
    """The mean coefficient profile over ``(profiles, n_checkpoints)`` pairs; None unless
    every one has a heatmap of one shape."""
    profs = [p for p, _ in weighted]
    if profs[0] is None or not all(p is not None and np.shape(p["heatmap"]) ==
                                   np.shape(profs[0]["heatmap"]) for p in profs):
        return None
    w = [n for _, n in weighted]
    heat = np.average([np.asarray(p["heatmap"], np.float64) for p in profs], axis=0, weights=w)
    return {"heatmap": heat, "layer_mean": heat.mean(axis=1),
            "global_mean": float(np.average([p["global_mean"] for p in profs], weights=w))}


def _results(title: str, res: dict, entries: Sequence[dict], settings: Settings, loss: str,
             profiles: dict | None, meta: dict) -> dict:
    """The results dict from the statistics (``res``) and the per-checkpoint entries."""
    replays = [e["replay"] for e in entries]
    results = {
        "title": title,
        "unit": res["unit"],
        "loss": loss,
        "replay": {"exact": all(r["exact"] for r in replays),
                   "max_abs_dlogit": float(np.max([r["max_abs_dlogit"] for r in replays])),
                   "nll": float(np.mean([r["nll"] for r in replays])),
                   "nll_replay": float(np.mean([r["nll_replay"] for r in replays])),
                   "per_checkpoint": replays, "atol": settings.replay_atol},
        "conditions": res["conditions"],
        "effects": res["effects"],
    }
    if "small_n_warning" in res:
        results["small_n_warning"] = res["small_n_warning"]
    if settings.variance:
        results["variance"] = _mean_dicts([e["variance"] for e in entries])
    if profiles is not None:
        results["profiles"] = profiles
    results["meta"] = {**meta, "checkpoints": list(entries)}
    return results


# What audits run apart must share to be combined (results.json's meta keys).
COMBINE_MUST_MATCH = ("settings", "windows", "task", "not_applicable", "seeds")


def combine_stored(parts: Sequence[dict]) -> dict:
    """One audit of every checkpoint in ``parts`` (results.json contents of audits run apart,
    e.g. each seed as soon as it finished training), each checkpoint one unit. With several
    checkpoints the statistics read only each one's mean ΔNLL, which every results.json
    keeps, so the numbers equal those of auditing the checkpoints together. The parts must
    share settings, windows (by sha256), task and model; else :class:`AuditError`."""
    first = parts[0]["meta"]
    for key in COMBINE_MUST_MATCH:
        odd = [i for i, p in enumerate(parts) if p["meta"].get(key) != first.get(key)]
        if odd:
            raise AuditError(f"audit {odd[0] + 1} differs from audit 1 in its {key}; combine "
                             "only audits run with one config on one data split (rerun it "
                             "with the others' config)")
    model = {p["title"].split(", ")[0] for p in parts}
    if len(model) > 1:
        raise AuditError(f"the audits are of different models ({', '.join(sorted(model))}); "
                         "combine the checkpoints of one family and variant")
    entries = [c for p in parts for c in p["meta"]["checkpoints"]]
    shas = [c.get("params_sha256") for c in entries]
    dup = next((c["name"] for c, h in zip(entries, shas) if h and shas.count(h) > 1), None)
    if dup is not None:
        raise AuditError(f"checkpoint {dup} appears twice (same params sha256); each "
                         "checkpoint is one unit, pass it once")
    if len(entries) < 2:
        raise AuditError("combining needs at least two checkpoints; pass every seed's audit")
    settings = _stored_settings(first)
    units = [{"delta": {n: np.asarray([c["delta_nll"][n]], np.float64)
                        for n in settings.conditions}} for c in entries]
    labels = {n: row["label"] for n, row in parts[0]["conditions"].items()}
    res = summarize(units, settings, {})
    for name, row in res["conditions"].items():
        row["label"] = labels.get(name, name)
    res = _with_not_applicable(res, first["not_applicable"], labels)
    meta = {k: v for k, v in first.items()
            if k not in ("checkpoints", "single_checkpoint_note", "wall_seconds", "command")}
    if all("run_configs" in p["meta"] for p in parts):
        meta["run_configs"] = [c for p in parts for c in p["meta"]["run_configs"]]
    meta["combined_from"] = [{"command": p["meta"].get("command"),
                              "checkpoints": [c["name"] for c in p["meta"]["checkpoints"]],
                              "wall_seconds": p["meta"].get("wall_seconds")} for p in parts]
    profiles = _pooled_profiles([(p.get("profiles"), len(p["meta"]["checkpoints"]))
                                 for p in parts])
    title = f"{model.pop()}, {len(entries)} checkpoints (audited apart, combined)"
    return _results(title, res, entries, settings, parts[0]["loss"], profiles, meta)


def _stored_settings(meta: dict) -> Settings:
    cfg = dict(meta["settings"])
    cfg["criteria"] = stats.Criteria(**cfg["criteria"])
    return Settings(**cfg)


def summarize_stored(results: dict) -> dict | None:
    """The ``conditions`` / ``effects`` sections recomputed from a results.json's stored
    per-checkpoint values (per-window ΔNLL where kept, else, with several checkpoints, each
    checkpoint's mean ΔNLL, which is all the checkpoint-level statistics read) and its
    settings; None for a single checkpoint whose per-window values were not kept."""
    meta = results["meta"]
    settings = _stored_settings(meta)
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
