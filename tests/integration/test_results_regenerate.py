"""Every committed result, regenerated and read (the checks and their own tests, which the unit
tier runs: tests/unit/test_figures.py, tests/unit/test_results_files.py): each figure under
results/ re-rendered from its JSON with its data inside the axes, no text overlapping, titles
no smaller than tick labels; each audit's results.json reproduces from its stored values."""
import json

import pytest

from tests.unit.test_figures import (
    ALL, ROOT, assert_data_inside, assert_no_overlap, assert_titles_not_smaller_than_ticks)
from tests.unit.test_results_files import RESULTS, mismatches


@pytest.mark.parametrize("png,draw", ALL, ids=[str(p.relative_to(ROOT / "results"))
                                               for p, _ in ALL])
def test_every_figure_holds_its_data_and_reads(png, draw):
    """Each figure scripts/figures.py draws: data inside the axes, no text overlap or text cut
    off at the edge, titles at least as large as tick labels."""
    fig = draw()
    assert_data_inside(fig, png.name)
    assert_no_overlap(fig, png.name)
    assert_titles_not_smaller_than_ticks(fig, png.name)


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_results_json_reproduces_from_its_stored_values(path):
    results = json.loads(path.read_text())
    assert mismatches(results) == []
