"""Figures a paper can use (issue 33): every plot under results/ re-rendered from its JSON
with axis labels, a colorbar label, the model's block numbers, the run's name (not a path)
in titles, one ΔNLL scale, a sentence for an empty panel, and no two text boxes overlapping."""
from __future__ import annotations

import itertools
import json
import pathlib

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from dynjax.audit import report
from dynjax.scorecard import report as card_report

ROOT = pathlib.Path(__file__).resolve().parents[1]
AUDITS = sorted(p for p in (ROOT / "results").rglob("results.json")
                if "conditions" in json.loads(p.read_text()))
CARDS = sorted((ROOT / "results").rglob("scorecard.json"))


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
    for name, fig in report.figures(results):
        assert_no_overlap(fig, name)
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
        assert_no_overlap(fig, card["run"])
        assert "/" not in fig._suptitle.get_text().split(" (")[0]
        if "dependence" in card:
            assert fig.axes[1].get_xscale() == "symlog"
        else:   # a dense model: the two coefficient panels are sentences, not empty axes
            for ax in fig.axes[:2]:
                assert not ax.axison and "No coefficients" in ax.texts[0].get_text()
    md = card_report.render_markdown(json.loads(path.read_text())["cards"])
    assert md.count("Forward measured:") == len(json.loads(path.read_text())["cards"])


def test_every_png_under_results_has_a_vector_twin():
    missing = [str(p.relative_to(ROOT)) for p in (ROOT / "results").rglob("*.png")
               if not (p.with_suffix(".svg").exists() or p.with_suffix(".pdf").exists())]
    assert missing == []
