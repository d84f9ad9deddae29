"""The one figure style: type sizes, vector twins, axis limits that hold the data.

Every plot in dynjax and its studies is drawn inside :func:`styled` and written by
:func:`save` (a PNG and its SVG and PDF twins, text kept as text so a journal's editor can
change it). Limits come from :func:`fit`, not from autoscaling: matplotlib's symlog autoscale
can end an axis inside an error bar, and a paper takes the figure as it is.
"""
from __future__ import annotations

import functools
from pathlib import Path

import matplotlib
import numpy as np

from dynjax.jsonio import atomic_write

# Titles are never smaller than tick labels; fonts stay text in SVG (none) and PDF (42 =
# TrueType embedded, not outlines).
STYLE = {"font.size": 9, "axes.titlesize": 10, "figure.titlesize": 11, "axes.labelsize": 9,
         "xtick.labelsize": 8, "ytick.labelsize": 8, "legend.fontsize": 8,
         "legend.title_fontsize": 8, "svg.fonttype": "none", "pdf.fonttype": 42,
         "ps.fonttype": 42, "svg.hashsalt": "dynjax"}
# No creation date in the vector files: a figure redrawn from the same data is the same bytes
UNDATED = {"svg": {"Date": None}, "pdf": {"CreationDate": None}}
TWINS = ("svg", "pdf")   # the vector files beside every PNG


def styled(fn):
    """Run a plotting function under :data:`STYLE` (type sizes are read when text is made)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with matplotlib.rc_context(STYLE):
            return fn(*args, **kwargs)
    return wrapper


def save(fig, path, dpi: int = 120) -> None:
    """``path`` (a .png) and its vector twins (.svg, .pdf), each written atomically."""
    path = Path(path)
    with matplotlib.rc_context(STYLE):
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=dpi))
        for ext in TWINS:
            atomic_write(path.with_suffix(f".{ext}"),
                         lambda f: fig.savefig(f, format=ext, metadata=UNDATED[ext]))


def fit(ax, axis: str, values, margin: float = 0.05, include=()) -> None:
    """Set ``ax``'s ``axis`` ("x" or "y") limits to hold every finite value in ``values``
    (estimates and interval ends) and ``include``, with ``margin`` of the span on each side
    measured in the axis' own scale (log, symlog). All values > 0 on a symlog axis start
    it at 0: no empty negative half."""
    v = np.asarray([x for x in [*_flat(values), *include]
                    if x is not None and np.isfinite(x)], float)
    if v.size == 0:
        return
    scale = getattr(ax, f"get_{axis}scale")()
    tr = (ax.xaxis if axis == "x" else ax.yaxis).get_transform()
    if scale == "log":
        v = v[v > 0]
        if v.size == 0:
            return
    t = tr.transform(np.stack([v, v], 1))[:, 0]
    lo, hi = t.min(), t.max()
    pad = margin * (hi - lo) if hi > lo else max(abs(hi) * margin, 0.05)
    lo_t, hi_t = lo - pad, hi + pad
    inv = tr.inverted()
    lo_v, hi_v = (inv.transform([[x, x]])[0, 0] for x in (lo_t, hi_t))
    if scale == "symlog" and v.min() > 0:   # a value at 0 keeps its margin (its marker)
        lo_v = 0.0
    getattr(ax, f"set_{axis}lim")(lo_v, hi_v)


def plain_log_ticks(ax, axis: str = "x") -> None:
    """Ticks of a log axis at 1, 2, 5 x 10^k written as plain numbers (0.5, 1, 2), no
    minor-tick labels: ``6×10⁻¹`` labels crowd each other and a reader converts them."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    a = ax.xaxis if axis == "x" else ax.yaxis
    lo, hi = sorted(getattr(ax, f"get_{axis}lim")())
    narrow = hi / lo < 4   # call after the limits are set: a narrow span gets every digit
    a.set_major_locator(LogLocator(subs=tuple(range(1, 10)) if narrow else (1.0, 2.0, 5.0)))
    a.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    a.set_minor_formatter(NullFormatter())


def _flat(values) -> list:
    """Numbers of a ragged nest of lists and arrays, in order."""
    if values is None or isinstance(values, (int, float, np.number)):
        return [values]
    return [x for v in values for x in _flat(v)]


def dot_ci(ax, labels, est, lo, hi, color="C0", marker="o", label=None, offset=0.0):
    """A horizontal dot-and-interval plot (one row per label, first at the top): the
    diverging form for signed quantities, where bars would mean nothing."""
    est, lo, hi = (np.asarray(a, float) for a in (est, lo, hi))
    y = np.arange(len(labels)) + offset
    err = np.stack([np.where(np.isfinite(lo), est - lo, 0.0),
                    np.where(np.isfinite(hi), hi - est, 0.0)])
    ax.errorbar(est, y, xerr=err, fmt=marker, color=color, capsize=3, label=label)
    ax.set_yticks(np.arange(len(labels)), list(labels))
    if not ax.yaxis_inverted():
        ax.invert_yaxis()
    return y

