"""The docs a newcomer reads: a short README, and every link in it and in docs/ resolves."""
import pathlib
import re

import pytest

from tests.conftest import ROOT

PAGES = [pathlib.Path(ROOT, "README.md"), *sorted(pathlib.Path(ROOT, "docs").glob("*.md")),
         *sorted(pathlib.Path(ROOT, "results").glob("*/README.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def local_links(page: pathlib.Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)   # code holds no links
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_readme_is_short():
    assert pathlib.Path(ROOT, "README.md").stat().st_size <= 15 * 1024


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_local_link_resolves(page):
    missing = [t for t in local_links(page) if not (page.parent / t.split("#")[0]).exists()]
    assert missing == []


def test_a_broken_link_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("see [there](nowhere.md) and [here](page.md), `[x](y)` in ```\n[a](b)\n```")
    assert local_links(page) == ["nowhere.md", "page.md"]


def test_performance_tables_are_the_results_file():
    """docs/performance.md's PyTorch, user-path, CPU-limit and profile tables are what
    benchmarks/vs_pytorch_tables.py renders from results/vs_pytorch.json, digit for digit."""
    import json

    from benchmarks.vs_pytorch_tables import render
    res = json.loads(pathlib.Path(ROOT, "results", "vs_pytorch.json").read_text())
    page = pathlib.Path(ROOT, "docs", "performance.md").read_text()
    missing = [table.splitlines()[0] for table in render(res).split("\n\n") if table not in page]
    assert missing == []


def test_write_puts_each_table_back_in_its_place(tmp_path):
    """``--write`` on a page whose tables are stale restores the page exactly; a page that lost
    a table's header is refused, naming it, with the page untouched."""
    import json

    from benchmarks.vs_pytorch_tables import write
    res = json.loads(pathlib.Path(ROOT, "results", "vs_pytorch.json").read_text())
    good = pathlib.Path(ROOT, "docs", "performance.md").read_text()
    stale = re.sub(r"\| \*\*\d\.\d\d\*\*", "| **9.99**", good)
    stale = stale.replace("| matmuls (dots and the fusions around them) | ", "| matmuls | 0 | ")
    assert stale != good
    page = tmp_path / "performance.md"
    page.write_text(stale)
    write(res, page)
    assert page.read_text() == good
    page.write_text(good.replace("seconds per step", "time per step"))
    with pytest.raises(SystemExit, match="no table headed 'seconds per step'"):
        write(res, page)
    assert page.read_text() == good.replace("seconds per step", "time per step")
