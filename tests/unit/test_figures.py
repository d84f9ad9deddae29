"""Figures a paper can use (issues 33, 49), the checks and their own tests (every plot under
results/ re-rendered from its JSON by scripts/figures.py, the one regeneration command, and
checked: tests/integration/test_results_regenerate.py): axis labels, a colorbar label,
the model's block numbers, the run's name (not a path) in titles, one ΔNLL scale, a sentence
for an empty panel, no two text boxes overlapping, every artist's data inside its axes (no
whisker clipped at the edge), titles no smaller than tick labels, and SVG and PDF twins that
keep text as text."""
from __future__ import annotations

import importlib.util
import itertools
import json
import pathlib

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.figure import Figure

from dynjax.audit import report
from dynjax.scorecard import report as card_report

ROOT = pathlib.Path(__file__).resolve().parents[2]
AUDITS = sorted(p for p in (ROOT / "results").rglob("results.json")
                if "conditions" in json.loads(p.read_text()))
CARDS = sorted((ROOT / "results").rglob("scorecard.json"))
_spec = importlib.util.spec_from_file_location("figures_script", ROOT / "scripts/figures.py")
FIGURES = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(FIGURES)
ALL = FIGURES.figures(ROOT / "results")


def texts(fig):
    """Every visible non-empty text of the figure with its box on the canvas."""
    FigureCanvasAgg(fig).draw()
    r = fig.canvas.get_renderer()
    out = []
    for ax in fig.axes:
        if not ax.axison:    # a sentence panel: its text only
            out += [(t.get_text(), t.get_window_extent(r)) for t in ax.texts + [ax.title]
                    if t.get_text().strip()]
            continue
        (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
        drawn = [t for t in ax.get_xticklabels() if x0 - 1e-9 <= t.get_position()[0] <= x1 + 1e-9]
        drawn += [t for t in ax.get_yticklabels() if y0 - 1e-9 <= t.get_position()[1] <= y1 + 1e-9]
        for t in [*drawn, ax.xaxis.label, ax.yaxis.label, ax.title]:
            if t.get_visible() and t.get_text().strip():
                out.append((t.get_text(), t.get_window_extent(r)))
    if fig._suptitle is not None:
        out.append((fig._suptitle.get_text(), fig._suptitle.get_window_extent(r)))
    return out


def _inside(points, box, name, what, pad=1.5):
    """Every finite display point of ``points`` (N, 2) lies in ``box`` (+ ``pad`` pixels)."""
    pts = np.asarray(points, float).reshape(-1, 2)
    pts = pts[np.isfinite(pts).all(axis=1)]
    out = pts[(pts[:, 0] < box.x0 - pad) | (pts[:, 0] > box.x1 + pad)
              | (pts[:, 1] < box.y0 - pad) | (pts[:, 1] > box.y1 + pad)]
    assert out.size == 0, (f"{name}: {what} drawn outside its axes (clipped): "
                           f"{out[:3].round(1).tolist()} not in {np.round(box.extents, 1)}")


def assert_data_inside(fig, name):
    """Lines, markers, error bars, scatter points, patches (bars, bands), images and texts of
    every axes lie inside that axes: nothing is cut off by the axis limits."""
    FigureCanvasAgg(fig).draw()
    r = fig.canvas.get_renderer()
    for ax in fig.axes:
        box = ax.get_window_extent(r)
        for line in ax.lines:
            xy = line.get_transform().transform(np.asarray(line.get_xydata(), float))
            _inside(xy, box, name, f"line {line.get_label()!r}")
            if line.get_marker() not in (None, "", "None", " ") and len(xy):
                rad = line.get_markersize() * fig.dpi / 72 / 2
                for dx, dy in ((rad, 0), (-rad, 0), (0, rad), (0, -rad)):
                    _inside(xy + [dx, dy], box, name, f"marker of {line.get_label()!r}")
        for coll in ax.collections:
            if isinstance(coll, LineCollection):   # error-bar whiskers
                for seg in coll.get_segments():
                    _inside(coll.get_transform().transform(seg), box, name, "error bar")
            elif isinstance(coll, PathCollection):
                _inside(coll.get_offset_transform().transform(coll.get_offsets()), box, name,
                        "scatter point")
        for patch in ax.patches:
            e = patch.get_window_extent(r)
            _inside([[e.x0, e.y0], [e.x1, e.y1]], box, name, f"patch {patch.get_label()!r}")
        for im in ax.images:
            e = im.get_window_extent(r)
            _inside([[e.x0, e.y0], [e.x1, e.y1]], box, name, "image")
        for t in ax.texts:
            if t.get_visible() and t.get_text().strip():
                e = t.get_window_extent(r)
                _inside([[e.x0, e.y0], [e.x1, e.y1]], box, name, f"text {t.get_text()!r}")


def assert_titles_not_smaller_than_ticks(fig, name):
    for ax in fig.axes:
        if not ax.axison or not ax.get_title():
            continue
        ticks = [t.get_fontsize() for t in ax.get_xticklabels() + ax.get_yticklabels()]
        assert ax.title.get_fontsize() >= max(ticks, default=0), (name, ax.get_title())




def test_the_extent_check_fails_on_a_clipped_whisker():
    """The check is not vacuous: a whisker past the axis limit, or a point, is caught."""
    fig = Figure()
    ax = fig.add_subplot()
    ax.errorbar([1.0, 2.0], [0, 1], xerr=[[0.1, 0.1], [0.1, 1.5]], fmt="o")
    ax.set_xlim(0, 3)
    with pytest.raises(AssertionError, match="outside its axes"):
        assert_data_inside(fig, "clipped")
    ax.set_xlim(0, 4)
    assert_data_inside(fig, "fits")
    ax.plot([5.0], [0.5], "o")
    with pytest.raises(AssertionError, match="outside its axes"):
        assert_data_inside(fig, "point")


def test_regeneration_finds_every_figure_under_results():
    """One command redraws every figure: each PNG under results/ has a data file that
    scripts/figures.py recognises, and nothing it draws lacks a committed PNG."""
    drawn = {p for p, _ in ALL}
    assert drawn == set((ROOT / "results").rglob("*.png"))


def assert_no_overlap(fig, name):
    boxes = texts(fig)
    for (a, ba), (b, bb) in itertools.combinations(boxes, 2):
        ba2, bb2 = ba.shrunk(0.98, 0.9), bb.shrunk(0.98, 0.9)
        assert not ba2.overlaps(bb2), f"{name}: {a!r} overlaps {b!r}"
    w, h = fig.canvas.get_width_height()
    for t, b in boxes:   # nothing cut off at the edge
        assert b.x0 >= -1 and b.y0 >= -1 and b.x1 <= w + 1 and b.y1 <= h + 1, (name, t)


@pytest.mark.parametrize("path", AUDITS, ids=lambda p: str(p.relative_to(ROOT / "results")))
def test_audit_figures_are_labelled_and_do_not_overlap(path):
    results = json.loads(path.read_text())
    for name, fig in report.figures(results):   # drawn and checked for overlap above
        ax = fig.axes[0]
        assert ax.get_xlabel() and ax.get_ylabel() or name == "delta_nll.png"
        assert "/" not in ax.get_title().split(":")[0], "a path in the title"
        if name == "delta_nll.png":
            assert ax.get_xscale() == "symlog" and "nats" in ax.get_xlabel()
        if name == "coeff_heatmap.png":
            colorbar = fig.axes[1]
            assert colorbar.get_ylabel() and "coefficient" not in colorbar.get_ylabel()[:11]
            assert ax.get_ylabel().startswith("block")


def test_mod_heatmap_numbers_blocks_as_the_model():
    results = {"conditions": {}, "unit": "u", "profiles": {
        "heatmap": [[0.0, 1.0], [1.0, 0.0]], "layer_mean": [0.5, 0.5], "global_mean": 0.5},
        "variance": {"['router']": {}},
        "meta": {"checkpoints": [{"family": "mod", "name": "mod_s0"}],
                 "run_configs": {"r": {"model": {"n_layers": 4, "mod_every": 2}}}}}
    ax = report.plot_heatmap(results).axes
    assert [t.get_text() for t in ax[0].get_yticklabels()] == ["1", "3"]
    assert "router score" in ax[1].get_ylabel()
    assert ax[0].get_title().startswith("mod_s0:")


@pytest.mark.parametrize("path", CARDS, ids=lambda p: str(p.relative_to(ROOT / "results")))
def test_scorecard_figures_do_not_overlap_and_say_when_a_panel_is_empty(path):
    for card in json.loads(path.read_text())["cards"]:
        fig = card_report.plot(card)
        assert "/" not in fig._suptitle.get_text().split(" (")[0]
        if "dependence" in card:
            assert fig.axes[1].get_xscale() == "symlog"
        else:   # a dense model: the two coefficient panels are sentences, not empty axes
            for ax in fig.axes[:2]:
                assert not ax.axison and "No coefficients" in ax.texts[0].get_text()
    md = card_report.render_markdown(json.loads(path.read_text())["cards"])
    assert md.count("Forward measured:") == len(json.loads(path.read_text())["cards"])


def test_every_png_under_results_has_svg_and_pdf_twins_with_text_as_text():
    missing = [str(p.relative_to(ROOT)) for p in (ROOT / "results").rglob("*.png")
               for ext in (".svg", ".pdf") if not p.with_suffix(ext).exists()]
    assert missing == []
    for png in (ROOT / "results").rglob("*.png"):
        assert "<text" in png.with_suffix(".svg").read_text(), png   # svg.fonttype none
        assert b"/Type3" not in png.with_suffix(".pdf").read_bytes(), png   # pdf.fonttype 42


def test_execution_panel_draws_each_ratio_with_its_spread_over_rounds():
    """A card whose latency rows record their rounds' ratios gets a whisker over each row's
    range, inside the axes, on a log axis with the band around 1."""
    card = json.loads((ROOT / "results/scorecard/scorecard.json").read_text())["cards"][0]
    spans = {}
    for name, row in card["execution"]["latency"].items():
        row["ratio_rounds"] = [row["ratio"] * 0.8, row["ratio"], row["ratio"] * 1.3]
        spans[name] = (row["ratio"] * 0.8, row["ratio"] * 1.3)
    fig = card_report.plot(card)
    assert_data_inside(fig, "rounds")
    ax = fig.axes[2]
    assert ax.get_xscale() == "log" and "range over rounds" in ax.get_xlabel()
    drawn = sorted(tuple(sorted(seg[:, 0])) for c in ax.collections
                   if isinstance(c, LineCollection) for seg in c.get_segments()
                   if seg[0, 0] != seg[1, 0])
    np.testing.assert_allclose(drawn, sorted(spans.values()), rtol=1e-12)


def test_a_figure_saved_twice_is_the_same_bytes(tmp_path):
    """No creation date or random ids in the vector twins: a figure redrawn from unchanged
    data leaves its committed files unchanged (no diff without a change)."""
    from dynjax.figures import save

    def draw():
        fig = Figure()
        fig.add_subplot().errorbar([1.0, 2.0], [0, 1], xerr=0.1, fmt="o")
        return fig
    for d in "ab":
        (tmp_path / d).mkdir()
        save(draw(), tmp_path / d / "f.png")
    for ext in ("png", "svg", "pdf"):
        assert (tmp_path / "a" / f"f.{ext}").read_bytes() == (tmp_path / "b" / f"f.{ext}").read_bytes(), ext
