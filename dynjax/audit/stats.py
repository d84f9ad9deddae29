"""FCA effects and statistics. Every number is float64 NumPy; summaries are plain dicts.

The unit of inference is the trained checkpoint (one training seed): ``summarize_checkpoints``
gives a checkpoint-level bootstrap CI and an exact two-sided sign-flip p-value. With a single
checkpoint there is nothing to resample across seeds, so ``summarize_windows`` describes
stability across evaluation windows and reassignments instead, and its ``unit`` says so.

A summary dict has the keys ``estimate, ci_low, ci_high, level, n, unit, ci_method, p,
p_method, note`` (``note`` is "" unless something was degenerate, e.g. n < 3 gives NaN CIs).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import scipy.stats
from statsmodels.stats.multitest import multipletests

UNIT_CHECKPOINT = "checkpoint"
UNIT_WINDOWS = "evaluation window x reassignment (single checkpoint)"
MIN_BOOTSTRAP_N = 3
# Below this many checkpoints a BCa interval is about the range of the data (with 3 values
# its bounds sit at or next to the smallest and largest), not a 95% interval.
MIN_RELIABLE_BCA_N = 5
RETENTION_DEFINITION = (
    "retention = 1 - mean(ΔNLL static) / mean(ΔNLL reference) over units (ratio of means): "
    "the primary figure, and the one the high-retention criterion tests, because it is the "
    "share of the average gap the static profile keeps and stays defined when one unit's "
    "reference gap is near zero, where a per-unit ratio explodes. The mean of per-unit "
    "ratios, 1 - mean(ΔNLL static_i / ΔNLL reference_i), is reported beside it")


@dataclasses.dataclass(frozen=True)
class Criteria:
    """The paper's prespecified criteria (fix them before running the audit)."""

    small_nll_upper: float = 0.002    # LayerMean "practically small": CI upper bound < this
    high_retention_lower: float = 0.95  # static retention "high": CI lower bound > this


def _f64(x):
    return np.asarray(x, dtype=np.float64)


# -------------------------------------------------------------------------------- effects

def factorial_effects(cc, dc, cs, ds) -> dict:
    """The paired 2x2 contrasts (elementwise, e.g. per checkpoint).

    CC correct, DC donor input, CS shuffled tokens, DS both. They are contrasts, not an
    additive decomposition: a negative interaction means overlapping damage.
    """
    cc, dc, cs, ds = map(_f64, (cc, dc, cs, ds))
    return {"E_input": ((dc - cc) + (ds - cs)) / 2,
            "E_token": ((cs - cc) + (ds - dc)) / 2,
            "E_interaction": ds - dc - cs + cc}


def retention(delta_static, delta_reference):
    """``1 - dNLL(S) / dNLL(R)``: share of the gap to the structure-removed reference kept."""
    return 1.0 - _f64(delta_static) / _f64(delta_reference)


# -------------------------------------------------------------------- intervals and tests

def _summary(estimate, n, unit, level, ci=(np.nan, np.nan), ci_method="", p=np.nan,
             p_method="", note=""):
    return {"estimate": float(estimate), "ci_low": float(ci[0]), "ci_high": float(ci[1]),
            "level": float(level), "n": int(n), "unit": unit, "ci_method": ci_method,
            "p": float(p), "p_method": p_method, "note": note}


def _too_few(n):
    return (f"n={n} {UNIT_CHECKPOINT}s: a bootstrap interval needs at least "
            f"{MIN_BOOTSTRAP_N}") if n < MIN_BOOTSTRAP_N else ""


def bootstrap_ci(values, level: float = 0.95, seed: int = 0, method: str = "BCa",
                 n_resamples: int = 9999) -> dict:
    """Bootstrap CI of the mean over checkpoints (``scipy.stats.bootstrap``).

    n < 3 returns NaN bounds with the reason in ``note`` (two values give only three distinct
    resample means). Identical values give the degenerate interval [v, v].
    """
    x = _f64(values).ravel()
    n = x.size
    est = x.mean() if n else np.nan
    if reason := _too_few(n):
        return _summary(est, n, UNIT_CHECKPOINT, level, note=reason)
    if np.ptp(x) == 0:
        return _summary(est, n, UNIT_CHECKPOINT, level, (est, est), "degenerate",
                        note="all values equal")
    res = scipy.stats.bootstrap((x,), np.mean, confidence_level=level, n_resamples=n_resamples,
                                method=method, rng=np.random.default_rng(seed))
    ci = res.confidence_interval
    return _summary(est, n, UNIT_CHECKPOINT, level, (ci.low, ci.high), f"bootstrap {method}")


def retention_ci(delta_static, delta_reference, level: float = 0.95, seed: int = 0,
                 unit: str = UNIT_CHECKPOINT, method: str = "BCa", n_resamples: int = 9999
                 ) -> dict:
    """Retention ``1 - mean(S)/mean(R)`` with a paired bootstrap CI over units.

    The estimate and CI are the ratio of means (:data:`RETENTION_DEFINITION` says why); the
    pairs (S_i, R_i) are resampled together. ``mean_of_ratios`` (``1 - mean(S_i/R_i)``,
    no interval) is reported beside it. Units are checkpoints, or windows with one.
    """
    s, r = _f64(delta_static).ravel(), _f64(delta_reference).ravel()
    if s.shape != r.shape:
        raise ValueError(f"paired values needed: {s.shape} static vs {r.shape} reference")
    n = s.size
    est = float(retention(s.mean(), r.mean())) if n else np.nan
    note = "" if r.mean() > 0 else "reference dNLL <= 0: retention is not meaningful"
    with np.errstate(divide="ignore", invalid="ignore"):
        per_unit = retention(s, r)
    both = {"mean_of_ratios": float(per_unit.mean()) if n else np.nan,
            "definition": RETENTION_DEFINITION}
    if n < MIN_BOOTSTRAP_N:
        return {**_summary(est, n, unit, level, note=f"n={n}: a bootstrap interval needs at "
                           f"least {MIN_BOOTSTRAP_N} paired units"), **both}
    if np.ptp(s) == 0 and np.ptp(r) == 0:
        return {**_summary(est, n, unit, level, (est, est), "degenerate",
                           note="all values equal"), **both}

    def stat(a, b, axis=-1):
        return 1.0 - a.mean(axis=axis) / b.mean(axis=axis)

    res = scipy.stats.bootstrap((s, r), stat, paired=True, vectorized=True,
                                confidence_level=level, n_resamples=n_resamples, method=method,
                                rng=np.random.default_rng(seed))
    ci = res.confidence_interval
    return {**_summary(est, n, unit, level, (ci.low, ci.high), f"paired bootstrap {method}",
                       note=note), **both}


def sign_flip_test(values, max_exact: int = 20, n_resamples: int = 99999, seed: int = 0
                   ) -> dict:
    """Two-sided sign-flip test of mean 0 (``scipy.stats.permutation_test``).

    Exact over all 2^n flips when n <= max_exact (7 positive values give 2/128); Monte Carlo
    otherwise (e.g. hundreds of evaluation windows), which ``method`` reports.
    """
    x = _f64(values).ravel()
    n = x.size
    if n == 0:
        return {"p": np.nan, "n": 0, "statistic": np.nan, "method": "", "note": "no values"}
    if n > max_exact:
        return {"p": _monte_carlo_sign_flip(x, n_resamples, seed), "n": n,
                "statistic": float(x.mean()), "note": "",
                "method": f"Monte Carlo sign-flip, {n_resamples} flips"}
    res = scipy.stats.permutation_test(
        (x,), lambda a, axis=-1: np.mean(a, axis=axis), permutation_type="samples",
        vectorized=True, alternative="two-sided", n_resamples=np.inf)
    return {"p": float(res.pvalue), "n": n, "statistic": float(res.statistic),
            "method": f"exact sign-flip, all 2^{n} flips", "note": "",
            "p_floor": sign_flip_floor(n)}


def sign_flip_floor(n: int) -> float:
    """The smallest two-sided p an exact sign-flip test over n units can give: 2 / 2^n
    (only the observed signs and their mirror image are as extreme)."""
    return min(1.0, 2.0 / 2.0 ** n)


def small_n_warning(n: int) -> str:
    """"" or why n checkpoints are too few for the checkpoint-level interval method."""
    if n >= MIN_RELIABLE_BCA_N:
        return ""
    return (f"only {n} checkpoint{'s' if n != 1 else ''} (training seeds): a BCa bootstrap "
            f"interval needs at least {MIN_RELIABLE_BCA_N} units to mean much (with {n} it "
            "spans about the range of the values), yet the prespecified verdicts are read "
            f"from it; the exact sign-flip p cannot fall below 2/2^{n} = "
            f"{sign_flip_floor(n):.4g}. Audit more seeds for a verdict")


def _monte_carlo_sign_flip(x, n_resamples: int, seed: int, chunk_values: int = 1 << 22):
    """p = (1 + #{|mean of flipped x| >= |mean x|}) / (1 + n_resamples), flips drawn in chunks
    of at most ``chunk_values`` signs so memory stays ~32 MB for any number of windows."""
    rng = np.random.default_rng(seed)
    observed = abs(x.mean()) * (1 - 1e-12)  # ties count as extreme, as in scipy
    hits, done = 0, 0
    while done < n_resamples:
        m = min(n_resamples - done, max(1, chunk_values // x.size))
        signs = rng.integers(0, 2, size=(m, x.size), dtype=np.int8) * 2 - 1
        hits += int(np.sum(np.abs(signs @ x) / x.size >= observed))
        done += m
    return (hits + 1) / (n_resamples + 1)


def holm(pvalues) -> np.ndarray:
    """Holm-adjusted p-values (statsmodels ``multipletests(method='holm')``); NaNs stay NaN."""
    p = _f64(pvalues)
    out = np.full(p.shape, np.nan)
    ok = np.isfinite(p)
    if ok.any():
        out[ok] = multipletests(p[ok], method="holm")[1]
    return out


# ------------------------------------------------------------------------------ summaries

def summarize_checkpoints(values, level: float = 0.95, seed: int = 0, n_resamples: int = 9999
                          ) -> dict:
    """One dNLL (or effect) per checkpoint -> mean, bootstrap CI and exact sign-flip p (with
    ``p_floor``, the smallest p the test can give for this n)."""
    out = bootstrap_ci(values, level=level, seed=seed, n_resamples=n_resamples)
    test = sign_flip_test(values)
    out.update(p=test["p"], p_method=test["method"])
    if "p_floor" in test:
        out["p_floor"] = test["p_floor"]
    return out


def _crossed_bootstrap(x, level, seed, n_resamples):
    """Percentile CI of the grand mean of x (R, W), resampling rows and columns independently.

    Reassignments and windows are crossed (one derangement spans all windows), so both
    are resampled: the statistic is counts_r @ x @ counts_w / (R W) per bootstrap draw.
    """
    rng = np.random.default_rng(seed)
    R, W = x.shape
    cr = rng.multinomial(R, np.full(R, 1.0 / R), size=n_resamples)
    cw = rng.multinomial(W, np.full(W, 1.0 / W), size=n_resamples)
    stats = np.einsum("br,rw,bw->b", cr, x, cw) / (R * W)
    alpha = (1 - level) / 2
    return np.quantile(stats, [alpha, 1 - alpha])


def summarize_windows(delta, level: float = 0.95, seed: int = 0, n_resamples: int = 9999
                      ) -> dict:
    """Single-checkpoint summary from per-window dNLL: ``(W,)`` or ``(R, W)`` reassignments.

    The CI resamples windows (and reassignments, crossed) with a percentile bootstrap; the
    p-value sign-flips per-window means (reassignment-averaged). It describes stability over
    evaluation data and randomization for this one checkpoint, not across training seeds.
    """
    x = _f64(delta)
    if x.ndim == 1:
        x = x[None]
    if x.ndim != 2:
        raise ValueError(f"per-window dNLL must be (W,) or (R, W), got shape {x.shape}")
    R, W = x.shape
    est = x.mean()
    test = sign_flip_test(x.mean(axis=0), seed=seed)
    kw = dict(p=test["p"], p_method=test["method"] + " over windows")
    if W < MIN_BOOTSTRAP_N:
        return _summary(est, W, UNIT_WINDOWS, level, note=f"{W} windows: too few for a "
                        "bootstrap interval", **kw)
    if R == 1:
        res = scipy.stats.bootstrap((x[0],), np.mean, confidence_level=level,
                                    n_resamples=n_resamples, method="percentile",
                                    rng=np.random.default_rng(seed))
        ci, how = (res.confidence_interval.low, res.confidence_interval.high), \
            "bootstrap percentile over windows"
    else:
        ci, how = _crossed_bootstrap(x, level, seed, n_resamples), \
            f"crossed bootstrap percentile over {W} windows x {R} reassignments"
    return _summary(est, W, UNIT_WINDOWS, level, ci, how, **kw)


# ------------------------------------------------------------------------------- criteria

def practically_small(summary: dict, criteria: Criteria = Criteria()) -> dict:
    """LayerMean criterion: the CI's upper bound is below ``criteria.small_nll_upper``."""
    hi = summary["ci_high"]
    return {"criterion": f"{summary['level']:.0%} CI upper bound < {criteria.small_nll_upper:g} NLL",
            "met": None if not np.isfinite(hi) else bool(hi < criteria.small_nll_upper)}


def high_retention(summary: dict, criteria: Criteria = Criteria()) -> dict:
    """Static-retention criterion: the CI's lower bound exceeds ``criteria.high_retention_lower``."""
    lo = summary["ci_low"]
    return {"criterion": f"{summary['level']:.0%} CI lower bound > {criteria.high_retention_lower:.0%}",
            "met": None if not np.isfinite(lo) else bool(lo > criteria.high_retention_lower)}
