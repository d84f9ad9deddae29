"""Module docstrings say what a module is for and why in at most ten lines (issue 44); the
long explanations live in docs/. ``LONG`` would list a module allowed over the bound with its
length (none is now): none may grow and no other module may pass the bound. dynjax/configs/ is not
bound (a config's docstring holds its command and expected result: DESIGN.md). A docstring's
pointer to its depth, ``docs/PAGE.md#anchor``, names a page and a heading that exist."""
import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2] / "dynjax"
DOCS = ROOT.parent / "docs"
POINTER = re.compile(r"docs/([\w-]+\.md)#([\w-]+)")
BOUND = 10
LONG: dict = {}  # module: lines allowed over the bound (none left); text beyond ten goes to docs/


def docstring_lines() -> dict:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        out[str(path.relative_to(ROOT))] = len(doc.strip("\n").split("\n")) if doc else 0
    return out


def too_long(lengths: dict) -> dict:
    """``{module: (lines, allowed)}`` of every module over its allowance."""
    return {m: (n, LONG.get(m, BOUND)) for m, n in lengths.items()
            if not m.startswith("configs/") and n > LONG.get(m, BOUND)}


def test_module_docstrings_are_short():
    assert too_long(docstring_lines()) == {}


def test_the_check_sees_a_long_docstring(monkeypatch):
    monkeypatch.setitem(LONG, "models/old.py", 49)
    assert too_long({"jsonio.py": 11, "configs/tiny.py": 40, "models/old.py": 49}) == \
        {"jsonio.py": (11, BOUND)}
    assert too_long({"models/old.py": 50}) == {"models/old.py": (50, 49)}


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: pathlib.Path) -> set:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {anchor(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def dangling(docstrings: dict) -> list:
    """``(module, page#anchor)`` of every docs pointer whose page or heading is missing."""
    out = []
    for module, doc in sorted(docstrings.items()):
        for page, name in POINTER.findall(doc):
            if not (DOCS / page).exists() or name not in anchors(DOCS / page):
                out.append((module, f"{page}#{name}"))
    return out


def test_docstring_pointers_reach_a_heading():
    docs = {str(p.relative_to(ROOT)): ast.get_docstring(ast.parse(p.read_text())) or ""
            for p in sorted(ROOT.rglob("*.py"))}
    assert sum(len(POINTER.findall(d)) for d in docs.values()) >= 30
    assert dangling(docs) == []


def test_the_pointer_check_sees_a_missing_heading():
    assert anchor("The `moe` family's blocks (`dynjax/models/moe.py`)") == \
        "the-moe-familys-blocks-dynjaxmodelsmoepy"
    assert dangling({"a.py": "Depth: docs/moe.md#the-moe-familys-blocks-dynjaxmodelsmoepy",
                     "b.py": "Depth: docs/moe.md#no-such-heading",
                     "c.py": "Depth: docs/nowhere.md#x"}) == \
        [("b.py", "moe.md#no-such-heading"), ("c.py", "nowhere.md#x")]
