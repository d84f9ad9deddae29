"""One checkpoint's audit: record, check the exact replay, then every condition's ΔNLL.

The step between the engine (engine.py: compiled record / replay / reassignment programs)
and the statistics across checkpoints (summary.py). :func:`audit_checkpoint` returns
per-window arrays and what describes the recorded coefficients (constant ranked axes,
layer x position profiles, variance shares)::

    engine = Engine(model.apply, model.schema, rows=64, window=128)   # LM: 128-token windows
    ckpt = audit_checkpoint(engine, params, calib_tokens, eval_tokens, Settings())
"""
from __future__ import annotations

import collections
import time

import jax
import numpy as np

from dynjax.runs import integrity
from dynjax.audit import interventions, variance
from dynjax.audit.engine import Engine, Recording
from dynjax.audit.settings import Settings, n_windows, reassignment_keys
from dynjax.coeffs import is_axes
from dynjax.errors import AuditError, ReplayError

def replay_message(rec: Recording, atol: float) -> str:
    return (f"exact replay FAILED: replaying the cached coefficients with the controller "
            f"disabled gives max |Δlogit| = {rec.max_abs_dlogit:.3g} (allowed {atol:g}) and "
            f"NLL {np.mean(rec.nll_replay, dtype=np.float64):.9f} against the record's "
            f"{np.mean(rec.nll_record, dtype=np.float64):.9f}. No intervention result is valid "
            "without exact replay. Fix the model's apply so that every coefficient passes "
            "dynjax.coeffs.site (record and replay are then one compiled program and the "
            "replay uses the coefficients verbatim); set replay_atol > 0 only to accept a "
            "tolerance knowingly.")


def audit_checkpoint(engine: Engine, params, calib_windows, eval_windows, settings: Settings,
                     bar=None, only: tuple | None = None, families: dict | None = None) -> dict:
    """Record, exact replay, every condition: per-window ΔNLL (Δloss) of one checkpoint.

    Returns ``{"replay", "nll_record", "nll_correct", "delta": {name: (R, W) | (W,)},
    "constant_along", "variance", "profiles", "forwards", "seconds"}`` (arrays are NumPy).
    ``only``: the top-level coefficient keys the conditions act on (None: every leaf);
    ``families``: ``{name: (keys, Settings)}``, each family's conditions run again on its
    leaves alone, replaying the same recording: ``out["families"][name]`` holds its
    ``delta`` and ``constant_along`` (:mod:`dynjax.audit.families`).
    """
    t0 = time.perf_counter()
    eval_windows = engine.task.prepare(eval_windows)
    calib_windows = engine.task.prepare(calib_windows)
    if n_windows(eval_windows) < 2:
        raise AuditError("cross-input reassignment needs at least 2 evaluation windows")
    before = collections.Counter(engine.forwards)
    rec = engine.record(params, eval_windows, check=True, bar=bar)
    exact = rec.max_abs_dlogit == 0.0 and np.array_equal(rec.nll_record, rec.nll_replay)
    ok = exact or (settings.replay_atol > 0 and np.isfinite(rec.max_abs_dlogit)
                   and rec.max_abs_dlogit <= settings.replay_atol)
    if not ok:
        nonfinite = integrity.digest(params)[1]   # a diverged run, not a replay fault
        if nonfinite:
            raise AuditError(f"the parameters are not finite ({nonfinite[0]} and "
                             f"{len(nonfinite) - 1} more arrays): the run diverged, so replay "
                             "cannot be judged; audit a checkpoint from before the divergence")
        raise ReplayError(replay_message(rec, settings.replay_atol))
    seconds = {"record_and_replay": time.perf_counter() - t0}
    t = time.perf_counter()
    cal = engine.record(params, calib_windows, check=False, bar=bar)
    seconds["calibration_record"] = time.perf_counter() - t

    base = rec.nll_replay.astype(np.float64)
    delta, constant = _conditions(engine, params, eval_windows, rec, cal, settings, base,
                                  seconds, bar, only)
    fams = {}
    for fam, (keys, fam_settings) in (families or {}).items():
        d, c = _conditions(engine, params, eval_windows, rec, cal, fam_settings, base,
                           seconds, bar, tuple(keys), prefix=f"{fam}:")
        fams[fam] = {"delta": d, "constant_along": c}
    out = {
        "replay": {"exact": bool(exact), "max_abs_dlogit": rec.max_abs_dlogit,
                   "nll": float(np.mean(rec.nll_record, dtype=np.float64)),
                   "nll_replay": float(np.mean(rec.nll_replay, dtype=np.float64)),
                   "atol": settings.replay_atol, "windows": int(len(rec.nll_record))},
        "nll_record": rec.nll_record.astype(np.float64),
        "nll_correct": base,
        "delta": delta,
        "constant_along": constant,
    }
    if families:
        out["families"] = fams
    cache = engine.to_host(rec.coeffs)
    if settings.variance:
        out["variance"] = variance.decompose_coeffs(cache, engine.schema)
    out["profiles"] = coefficient_profiles(cache, engine.schema)
    out["forwards"] = dict(engine.forwards - before)
    out["rows_per_forward"] = engine.rows
    seconds["total"] = time.perf_counter() - t0
    out["seconds"] = seconds
    return out


def _conditions(engine, params, eval_windows, rec, cal, settings, base, seconds, bar=None,
                only=None, prefix="") -> tuple[dict, dict]:
    """Every condition of ``settings`` on the leaves ``only``: ``(delta, constant_along)``;
    each condition's time goes into ``seconds`` under ``prefix + name``."""
    delta, constant = {}, {}
    group = tuple(n for n in settings.conditions if interventions.REGISTRY[n].randomized)
    for name in settings.conditions:
        t = time.perf_counter()
        if name == "correct":   # the checked replay: ΔNLL is 0 by construction
            delta[name] = np.zeros_like(base)
        elif name in group:
            if name == group[0]:
                keys = reassignment_keys(settings.seed, settings.reassignments)
                nlls = engine.randomized_nll(group, params, eval_windows, rec, keys,
                                             settings.max_reassign_bytes, bar=bar, only=only)
                delta.update({n: v.astype(np.float64) - base for n, v in nlls.items()})
                seconds[prefix + "+".join(group)] = time.perf_counter() - t
            continue
        else:
            nll = engine.deterministic_nll(name, params, eval_windows, rec, cal.coeffs,
                                           bar=bar, only=only)
            delta[name] = nll.astype(np.float64) - base
            rows = engine.transform(name, only)(
                rec.coeffs, cal.coeffs, np.arange(engine.rows, dtype=np.int32))
            constant[name] = constant_along(engine.to_host(rows), engine.schema)
        seconds[prefix + name] = time.perf_counter() - t
    return {n: delta[n] for n in settings.conditions}, constant


RANKED_AXES = ("token", "expert")


def constant_along(coeffs, schema) -> dict:
    """``{leaf path: [axes]}``: the ranked axes (token, expert) along which a leaf is constant.

    Why it matters: a controller that *ranks* its values meets exact ties there, and
    ``lax.top_k`` breaks ties by the lowest index. MoD's top-k over tokens then selects the
    first k positions of every window (and the router weight is the same for all of them);
    MoE's top-k over experts sends every token to the lowest-numbered expert, whose buffer
    fills in token order (later tokens drop). So a static profile or GlobalMean of routing
    scores is a fixed positional routing, not a smoothed version of the learned one. For
    gates (no ranking) a constant row is just what a static profile means.
    """
    out = {}
    flat = jax.tree_util.tree_flatten_with_path(schema, is_leaf=is_axes)[0]
    for (path, axes), a in zip(flat, jax.tree.leaves(coeffs)):
        a = np.asarray(a)
        const = [n for n in RANKED_AXES if n in axes and a.shape[axes.index(n)] > 1 and
                 np.all(a == np.take(a, [0], axis=axes.index(n)))]
        if const:
            out[jax.tree_util.keystr(path)] = const
    return out


def coefficient_profiles(cache, schema) -> dict | None:
    """Layer x position heatmap (mean over everything else), its layer means, the global mean.

    A leaf with a ``layer`` axis gives one row per layer; a per-layer list of leaves (MUDD)
    gives one row per leaf. Leaves without a ``token`` axis are skipped. An ``expert`` axis
    is reduced by its maximum (a token's top routing probability) rather than its mean,
    which is 1/E for every token since routing probabilities sum to one.
    """
    rows = []
    for axes, a in zip(jax.tree.leaves(schema, is_leaf=is_axes), jax.tree.leaves(cache)):
        if "token" not in axes:
            continue
        a = np.asarray(a, np.float64)
        if "expert" in axes:
            a = a.max(axis=axes.index("expert"), keepdims=True)
        keep = [axes.index(n) for n in ("layer", "token") if n in axes]
        m = a.mean(axis=tuple(i for i in range(a.ndim) if i not in keep))
        if len(keep) == 2 and keep[0] > keep[1]:
            m = m.T                                   # (token, layer) -> (layer, token)
        rows.extend(m if m.ndim == 2 else m[None])
    if not rows or len({r.shape for r in rows}) != 1:
        return None
    heat = np.stack(rows)
    return {"heatmap": heat, "layer_mean": heat.mean(axis=1), "global_mean": float(heat.mean())}
