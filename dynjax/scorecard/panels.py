"""The scorecard's numbers: the variation and dependence panels from an audit and a
checkpoint's coefficients, and the one-line verdicts (thresholds: configs/scorecard.py)."""
from __future__ import annotations

import jax
import numpy as np

from dynjax.coeffs import is_axes
from dynjax.models import FAMILIES

PANEL_CONDITIONS = ("cross_input", "token_shuffle", "static_profile", "structure_removed",
                    "token_identity", "expert_relabel", "weights_flat")   # those the audit ran


INPUT_AXES = ("example", "token")


def input_share(x, names) -> float:
    """Share of a coefficient leaf's variance left after removing its static profile (the
    mean over examples and tokens of each layer / stream / source / expert cell): what
    varies with the input and position. Static structure (a layer profile, an expert or
    source pattern, their interactions) counts as not varying."""
    x = np.asarray(x, np.float64)
    axes = tuple(i for i, n in enumerate(names) if n in INPUT_AXES)
    total = float(np.sum((x - x.mean()) ** 2))
    if total == 0.0 or not axes:
        return 0.0
    return float(np.sum((x - x.mean(axis=axes, keepdims=True)) ** 2)) / total


def variation(audit: dict, coeffs: dict, cfg, schema=None, family: str | None = None) -> dict:
    """Variance shares from the audit, each leaf's input-varying share and range, and
    routing summaries, from recorded coeffs. ``family`` defaults to ``cfg.family`` (the
    decoders'; a GatedMLP or MUDDPythia config has none)."""
    family = family or cfg.family
    out = {"variance": audit.get("variance", {}), "ranges": {}, "input_share": {}}
    if schema is not None:
        pairs = zip(jax.tree_util.tree_flatten_with_path(coeffs)[0],
                    jax.tree.leaves(schema, is_leaf=is_axes))
        out["input_share"] = {jax.tree_util.keystr(path): input_share(x, axes.names)
                              for (path, x), axes in pairs}
    for name, leaf in coeffs.items():   # a family may be a list or a dict of leaves (mHC)
        vals = np.concatenate([np.asarray(v, np.float64).ravel() for v in jax.tree.leaves(leaf)])
        out["ranges"][name] = {"min": float(vals.min()), "max": float(vals.max()),
                               "std": float(vals.std())}
    out.update(FAMILIES[family].routing_summary(cfg, coeffs))
    return out


def _dependence_rows(conditions: dict) -> dict:
    """The ΔNLL rows the scorecard shows and the static profile's retention, of one table."""
    rows = {}
    for name in PANEL_CONDITIONS:
        r = conditions.get(name)
        if r is None or r.get("not_applicable"):
            continue
        rows[name] = {k: r[k] for k in ("estimate", "ci_low", "ci_high", "p", "label")
                      if k in r}
    return {"conditions": rows,
            "retention": conditions.get("static_profile", {}).get("retention")}


def dependence(audit: dict) -> dict:
    """The audit's ΔNLL rows the scorecard shows, and the static profile's retention; with
    coefficient families audited apart, the same for each (``families``)."""
    out = {**_dependence_rows(audit["conditions"]), "unit": audit.get("unit"),
           "replay": audit["replay"]["exact"]}
    if audit.get("families"):
        out["families"] = {fam: {"sites": t["sites"], **_dependence_rows(t["conditions"])}
                           for fam, t in audit["families"].items()}
    return out


# ---------------------------------------------------------------------------- verdicts

def verdicts(card: dict, th) -> dict:
    """One line per axis; the thresholds are ``th`` (configs/scorecard.py)."""
    out = {}
    var = card.get("variation")
    if var is None:
        out["variation"] = "no coefficients: nothing varies"
    else:
        out["variation"] = _variation_verdict(var["input_share"].values(), th)
    dep = card.get("dependence")
    if dep is None:
        out["dependence"] = "no coefficients: nothing to depend on"
    else:
        out["dependence"] = _dependence_verdict(dep["conditions"], th)
        if dep.get("families"):   # one line each: does the function depend on this family?
            out["families"] = {}
            for fam, d in dep["families"].items():
                shares = [v for leaf, v in (var or {}).get("input_share", {}).items()
                          if any(leaf.startswith(f"['{k}']") for k in d["sites"])]
                out["families"][fam] = {"variation": _variation_verdict(shares, th),
                                        "dependence": _dependence_verdict(d["conditions"], th)}
    ex = card["execution"]
    lines = [_execution_verdict(ex, th, ex.get("baseline", "dense"), "")]
    if "structured" in ex:   # a faster program of the same model counts where it exists
        lines.append(_execution_verdict(ex["structured"], th, "dense", " on its open-blocks path"))
    out["execution"] = min(lines, key=_rank)   # the model's own program wins ties
    return out


def _variation_verdict(shares, th) -> str:
    share = max(shares, default=float("nan"))
    return (f"varies (up to {share:.1%} of the variance is not its static profile)"
            if share >= th.varies_min_input_share else
            f"nearly static (its static profile explains {1 - share:.1%})")


def _dependence_verdict(conditions: dict, th) -> str:
    lows = {k: r["ci_low"] for k, r in conditions.items()
            if k in ("cross_input", "static_profile")}
    strongest = max(lows, key=lows.get) if lows else None
    if strongest and lows[strongest] > th.depends_min_dnll:
        return (f"function depends on it ({conditions[strongest]['label']} costs "
                f"{conditions[strongest]['estimate']:+.4f} nats, CI low {lows[strongest]:+.4f})")
    return (f"little dependence (no reassignment's CI lower bound above "
            f"{th.depends_min_dnll} nats)")


VERDICT_ORDER = ("executes less", "saves FLOPs but not time", "no skipping")


def _rank(line: str) -> int:
    return next(i for i, p in enumerate(VERDICT_ORDER) if line.startswith(p))


def _execution_verdict(ex: dict, th, baseline: str, where: str) -> str:
    lat = ex["latency"].get(f"forward_b{th.latency_batch}", {}).get("ratio", float("nan"))
    saves = ex["flops_ratio_compiled"] <= th.executes_less_max_ratio
    faster = lat <= th.executes_less_max_ratio
    what = (f"executes {ex['flops_ratio_compiled']:.2f}x the FLOPs and runs {lat:.2f}x the "
            f"time of {baseline}{where} (forward, batch {th.latency_batch})")
    return ("executes less: " + what if saves and faster else
            "saves FLOPs but not time: " + what if saves else "no skipping: " + what)


