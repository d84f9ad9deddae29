"""Write an FCA run's ``report.md``, ``results.json`` and PNG plots, atomically.

Reads the results dict :func:`dynjax.audit.summary.assemble_results` makes ("title",
"unit", "replay" and "conditions" required; "effects", "variance", "profiles", "meta"
optional; arrays become lists, NaN null). The directory is assembled beside the target
and renamed into place, so a failure leaves the old directory or nothing, never half.
"""
from __future__ import annotations

import math
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from dynjax import figures as style
from dynjax.audit.interventions import REGISTRY
from dynjax.jsonio import portable, write_json_atomic, write_text_atomic

PLOTS = ("delta_nll.png", "coeff_heatmap.png", "depth_profile.png")   # with .svg, .pdf twins

# One ΔNLL axis for the audit, the scorecard and the FCA sweep: symmetric log, linear within
# ±DNLL_LINTHRESH nats, so a negative or zero estimate is drawn where it is, not clipped.
DNLL_LINTHRESH = 1e-3

# What a coefficient leaf is, by family and leaf name, for axis and colorbar labels.
COEFFICIENTS = {
    ("gates", "gate"): "gate g (multiplies the block's update; 1 = ungated)",
    ("mod", "router"): "MoD router score r (logit; a causal decoder enters when r > 0)",
    ("mod", "predictor"): "MoD predictor logit",
    ("moe", "router"): "top routing probability (max over experts, 0-1)",
    ("llm", "router"): "top routing probability (max over experts, 0-1)",
    ("llm", "mod_router"): "MoD router score r (logit; a causal decoder enters when r > 0)",
    ("llm", "mod_predictor"): "MoD predictor logit",
    ("mudd", "mix"): "dynamic mixing weight (dimensionless)",
    ("muddpythia", "mix"): "dynamic mixing weight (dimensionless)",
    ("gated_mlp", "p"): "unit open probability (0-1)",
}


# ---------------------------------------------------------------------------- data helpers

def _label(name: str) -> str:
    """A condition's display name (a row's own ``label``, e.g. LayerMean, comes first)."""
    return REGISTRY[name].label if name in REGISTRY else name


def to_jsonable(obj):
    """NumPy/JAX arrays and scalars to lists and floats; non-finite floats to None."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "__array__") and not isinstance(obj, (str, bytes)):
        arr = np.asarray(obj)
        return to_jsonable(arr.tolist()) if arr.ndim else to_jsonable(arr.item())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    return obj


# ------------------------------------------------------------------------------ formatting

def _num(v, fmt="{:.6f}"):
    return "—" if v is None or not np.isfinite(v) else fmt.format(v)


def _ci(s, fmt="{:.6f}"):
    lo, hi = s.get("ci_low"), s.get("ci_high")
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
        return "—" + (f" ({s['note']})" if s.get("note") else "")
    return f"[{fmt.format(lo)}, {fmt.format(hi)}]"


def _p(v):
    return "—" if v is None or not np.isfinite(v) else f"{v:.4g}"


def replay_status(replay: dict, bold: bool = False) -> str:
    """What the replay check found, for report.md and the console: exact, or accepted under
    the configured non-zero tolerance (which the audit only does when asked to)."""
    b = "**" if bold else ""
    dl = replay.get("max_abs_dlogit")
    if replay.get("exact"):
        return f"{b}exact{b} (bitwise: max |Δlogit| = {dl})"
    return (f"{b}not exact, accepted within the configured tolerance{b} replay_atol = "
            f"{replay.get('atol')} (max |Δlogit| = {dl:.3g}): every ΔNLL carries replay error "
            "of up to that size; set replay_atol = 0 to demand bitwise replay")


def _verdicts(row):
    parts = []
    for name, v in (row.get("verdicts") or {}).items():
        met = {True: "met", False: "not met", None: "undetermined"}[v.get("met")]
        parts.append(f"{name}: {met} ({v.get('criterion', '')})")
    return "; ".join(parts) or ""


def render_markdown(results: dict, plots: list[str]) -> str:
    """The paper's table layout as Markdown."""
    r = results
    lines = [f"# {r['title']}", "", f"Unit of inference: **{r['unit']}**."]
    lines += [f"Loss: {r['loss']}.", ""] if r.get("loss") else [""]
    rep = r["replay"]
    lines += [f"Replay: {replay_status(rep, bold=True)}; NLL {rep.get('nll')} vs replay "
              f"{rep.get('nll_replay')}.", ""]
    if r.get("small_n_warning"):
        lines += [f"**Warning:** {r['small_n_warning']}.", ""]
    lines += condition_table(r["conditions"])
    if r.get("effects"):
        lines += ["", "## Factorial effects (paired 2×2: CC, DC, CS, DS)", ""]
        lines += effects_table(r["effects"])
        lines += ["", "Contrasts, not an additive decomposition; a negative interaction means "
                  "the two interventions damage overlapping functions."]
    for fam, table in (r.get("families") or {}).items():
        lines += ["", f"## Family `{fam}` (conditions on {', '.join(table['sites'])} only; "
                  "every other coefficient replayed as recorded)", ""]
        if table.get("note"):
            lines += [f"Note: {table['note']}.", ""]
        lines += condition_table(table["conditions"])
        effects = {n: e for n, e in (table.get("effects") or {}).items()
                   if not e.get("not_applicable")}
        if effects:
            lines += [""] + effects_table(effects)
    if r.get("variance"):
        lines += ["", "## Variance decomposition (descriptive: share of total sum of squares)", ""]
        pct = "{:.2%}"
        for leaf, shares in r["variance"].items():
            body = ", ".join(f"{k} {_num(v, pct)}" for k, v in shares.items() if k != "total_ss")
            lines.append(f"- `{leaf}`: {body}")
    notes = report_notes(r)
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    lines.append("")
    return "\n".join(lines)


def condition_table(conditions: dict) -> list[str]:
    """One Markdown table of condition rows (ΔNLL, CI, p, retention, criteria)."""
    pct = "{:.2%}"
    lines = ["| condition | ΔNLL | 95% CI | p | Holm p | retention (95% CI) | criteria |",
             "|---|---|---|---|---|---|---|"]
    for name, row in conditions.items():
        ret = row.get("retention")
        ret_txt = "" if not ret else f"{_num(ret['estimate'], pct)} {_ci(ret, pct)}" + (
            f"; mean of ratios {_num(ret['mean_of_ratios'], pct)}"
            if "mean_of_ratios" in ret else "")
        lines.append(f"| {row.get('label') or _label(name)} | {_num(row['estimate'])} "
                     f"| {_ci(row)} | {_p(row.get('p'))} | {_p(row.get('p_holm'))} "
                     f"| {ret_txt} | {_verdicts(row)} |")
    return lines


def effects_table(effects: dict) -> list[str]:
    """The factorial effects as a Markdown table."""
    return ["| effect | estimate | 95% CI | p | Holm p |", "|---|---|---|---|---|"] + [
        f"| {n} | {_num(e['estimate'])} | {_ci(e)} | {_p(e.get('p'))} | {_p(e.get('p_holm'))} |"
        for n, e in effects.items()]


def report_notes(results: dict) -> list[str]:
    """What a reader must know to trust the table, gathered from results["meta"]: data
    shortfalls, conditions that do not apply, single-checkpoint statistics, and coefficients
    that an intervention made constant along a ranked axis (top-k then breaks ties by index)."""
    meta = results.get("meta") or {}
    notes = list((meta.get("data") or {}).get("notes", []))
    notes += [f"{name}: not applicable ({why})"
              for name, why in (meta.get("not_applicable") or {}).items()]
    if meta.get("single_checkpoint_note"):
        notes.append(meta["single_checkpoint_note"])
    rets = [row["retention"] for row in (results.get("conditions") or {}).values()
            if (row.get("retention") or {}).get("definition")]
    if rets:
        notes.append(rets[0]["definition"])
    for ck in meta.get("checkpoints", []):
        where = ck.get("name") or ck.get("run_dir") or "checkpoint"
        if ck.get("note"):
            notes.append(f"{where}: {ck['note']}")
        for cond, leaves in (ck.get("constant_along") or {}).items():
            label = (results.get("conditions", {}).get(cond) or {}).get("label") or \
                _label(cond)
            for leaf, axes in leaves.items():
                notes.append(f"{where}: under {label}, `{leaf}` is constant "
                             f"along {', '.join(axes)}: top-k ties break by lowest index, so "
                             "routing there is fixed by position, not smoothed")
    return notes


# ----------------------------------------------------------------------------------- plots

def dnll_axis(ax, axis: str = "x", label: str = "ΔNLL vs Correct (nats)") -> None:
    """The one ΔNLL scale convention (symlog, linear within ±DNLL_LINTHRESH), labelled."""
    getattr(ax, f"set_{axis}scale")("symlog", linthresh=DNLL_LINTHRESH)
    getattr(ax, f"set_{axis}label")(f"{label}\nsymmetric log, linear within "
                                    f"±{DNLL_LINTHRESH:g}")
    getattr(ax, f"axvline" if axis == "x" else "axhline")(0.0, color="grey", lw=0.6)


def run_name(results: dict) -> str:
    """The audited run's name for a title (its folder's name, never a path)."""
    cks = (results.get("meta") or {}).get("checkpoints") or []
    if len(cks) != 1:
        return f"{len(cks)} checkpoints" if cks else ""
    ck = cks[0]
    return ck.get("name") or Path(str(ck.get("run_dir", ""))).name


def _family(results: dict) -> str:
    cks = (results.get("meta") or {}).get("checkpoints") or [{}]
    return cks[0].get("family") or ""


def _model_config(results: dict) -> dict:
    rc = (results.get("meta") or {}).get("run_configs")
    first = next(iter(rc.values()), None) if isinstance(rc, dict) else (rc[0] if rc else None)
    return (first or {}).get("model", {}) if isinstance(first, dict) else {}


def coefficient_label(results: dict) -> str:
    """The profiled coefficient's name and meaning (COEFFICIENTS), e.g. the gate g."""
    profiles = results.get("profiles") or {}
    leaves = profiles.get("coefficients") or list(results.get("variance") or {})
    names = sorted({leaf.split("'")[1] if "'" in leaf else leaf for leaf in leaves})
    family = _family(results)
    return "; ".join(COEFFICIENTS.get((family, n), f"coefficient {n}") for n in names) or \
        "coefficient"


def block_numbers(results: dict, n_rows: int) -> list[int]:
    """The heatmap rows as the model numbers its blocks: MoD's routed blocks are the model's
    layers ``mod_layers`` (or every ``mod_every``-th: 1, 3, ...), not 0, 1, ..."""
    given = (results.get("profiles") or {}).get("blocks")
    if given and len(given) == n_rows:
        return [int(b) for b in given]
    m = _model_config(results)
    if _family(results) == "mod" and m.get("n_layers"):
        ids = list(m.get("mod_layers") or range(m.get("mod_every", 2) - 1, m["n_layers"],
                                                m.get("mod_every", 2)))
        if len(ids) == n_rows:
            return ids
    return list(range(n_rows))


def _title(results: dict, what: str) -> str:
    name = run_name(results)
    return f"{name}: {what}" if name else what


@style.styled
def plot_delta_nll(results: dict) -> Figure:
    """Each condition's ΔNLL and its interval as a dot and whisker on the symlog axis, the
    axis fitted to the whiskers."""
    rows = [(n, r) for n, r in results["conditions"].items() if n != "correct"]
    est = np.array([_nan(r["estimate"]) for _, r in rows])
    lo = np.array([_nan(r.get("ci_low")) for _, r in rows])
    hi = np.array([_nan(r.get("ci_high")) for _, r in rows])
    fig = Figure(figsize=(8, 0.5 * len(rows) + 2.4), layout="constrained")
    ax = fig.add_subplot()
    level = (rows[0][1].get("level") or 0.95) if rows else 0.95
    dnll_axis(ax, "x", f"ΔNLL vs Correct (nats, {level:.0%} CI)\nunit of inference: "
                       f"{results['unit']}")
    style.dot_ci(ax, [r.get("label") or _label(n) for n, r in rows], est, lo, hi)
    style.fit(ax, "x", [est, lo, hi], include=[0.0])
    ax.tick_params(axis="x", labelrotation=30)
    ax.set_title(_title(results, "functional dependence"))
    return fig


@style.styled
def plot_heatmap(results: dict) -> Figure:
    """Layer x position mean of the coefficient, rows numbered as the model's blocks."""
    heat = np.asarray(results["profiles"]["heatmap"], dtype=np.float64)
    blocks = block_numbers(results, heat.shape[0])
    what = coefficient_label(results)
    fig = Figure(figsize=(7.5, 3.8), layout="constrained")
    ax = fig.add_subplot()
    im = ax.imshow(heat, aspect="auto", origin="lower", interpolation="nearest")
    ax.set_xlabel("token position in the window")
    ax.set_ylabel("block (model's numbering)")
    ax.set_yticks(np.arange(len(blocks)), [str(b) for b in blocks])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(_title(results, "coefficient per block and position"))
    fig.colorbar(im, ax=ax).set_label(f"{what}\nmean over examples", fontsize=8)
    return fig


@style.styled
def plot_depth_profile(results: dict) -> Figure:
    """LayerMean (the static profile per block) against GlobalMean."""
    profiles = results["profiles"]
    layer_mean = np.asarray(profiles["layer_mean"], dtype=np.float64)
    blocks = block_numbers(results, len(layer_mean))
    fig = Figure(figsize=(6.5, 3.8), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(blocks, layer_mean, "o-", label="LayerMean (per block)")
    ax.set_xticks(blocks, [str(b) for b in blocks])
    ax.axhline(float(profiles["global_mean"]), color="k", ls="--", label="GlobalMean")
    ax.set_xlabel("block (model's numbering)")
    ax.set_ylabel(coefficient_label(results).replace(" (", "\n("), fontsize=8)
    ax.set_title(_title(results, "depth profile of the coefficient"))
    ax.legend()
    return fig


def _nan(v):
    return np.nan if v is None else float(v)


def plotters(results: dict) -> list:
    """(file name, plotting function) of every plot ``results`` has data for."""
    out = [("delta_nll.png", plot_delta_nll)]
    if results.get("profiles"):
        out += [("coeff_heatmap.png", plot_heatmap), ("depth_profile.png", plot_depth_profile)]
    return out


def figures(results: dict) -> list:
    """(file name, figure) of every plot ``results`` has data for."""
    return [(name, fn(results)) for name, fn in plotters(results)]


def write_report(results: dict, out_dir, overwrite: bool = True) -> Path:
    """Write report.md, results.json and the plots to ``out_dir`` as one atomic unit, with
    every absolute path made ``jsonio.portable`` (relative to the working directory, or a
    name)."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True to replace it")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tmp.chmod(0o755)
        clean = portable(to_jsonable(results))   # no absolute machine path in a result
        write_json_atomic(tmp / "results.json", clean, indent=2, sort_keys=False,
                          allow_nan=False)
        plots = []
        for name, fig in figures(clean):
            style.save(fig, tmp / name)
            plots.append(name)
        write_text_atomic(tmp / "report.md", render_markdown(clean, plots))
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` is set aside and removed only after."""
    if not out.exists():
        os.replace(tmp, out)
        return
    old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
    os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
