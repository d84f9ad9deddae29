"""Module docstrings say what a module is for and why in at most ten lines (issue 44); the
long explanations live in docs/ (a config's docstring keeps its command and expected result:
DESIGN.md). A docstring's pointer to its depth, ``docs/PAGE.md#anchor`` (or a results
README's), names a page and a heading that exist."""
import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2] / "dynjax"
POINTER = re.compile(r"((?:docs|results/[\w-]+)/[\w-]+\.md)#([\w-]+)")
BOUND = 10


def docstrings() -> dict:
    return {str(path.relative_to(ROOT)): ast.get_docstring(ast.parse(path.read_text()),
                                                           clean=False) or ""
            for path in sorted(ROOT.rglob("*.py"))}


def too_long(lengths: dict) -> dict:
    """``{module: lines}`` of every module whose docstring is over the bound."""
    return {m: n for m, n in lengths.items() if n > BOUND}


def test_module_docstrings_are_short():
    lengths = {m: len(d.strip("\n").split("\n")) if d else 0 for m, d in docstrings().items()}
    assert len(lengths) > 100 and lengths["models/mod.py"] > 1
    assert too_long(lengths) == {}


def test_the_check_sees_a_long_docstring():
    assert too_long({"jsonio.py": 11, "configs/tiny.py": 11, "models/mod.py": 10}) == \
        {"jsonio.py": 11, "configs/tiny.py": 11}


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: pathlib.Path) -> set:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {anchor(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def dangling(docs: dict) -> list:
    """``(module, page#anchor)`` of every docs pointer whose page or heading is missing."""
    out = []
    for module, doc in sorted(docs.items()):
        for page, name in POINTER.findall(doc):
            path = ROOT.parent / page
            if not path.exists() or name not in anchors(path):
                out.append((module, f"{page}#{name}"))
    return out


def test_docstring_pointers_reach_a_heading():
    docs = docstrings()
    assert sum(len(POINTER.findall(d)) for d in docs.values()) >= 40
    assert dangling(docs) == []


def test_the_pointer_check_sees_a_missing_heading():
    assert anchor("The `moe` family's blocks (`dynjax/models/moe.py`)") == \
        "the-moe-familys-blocks-dynjaxmodelsmoepy"
    assert dangling({"a.py": "Depth: docs/moe.md#the-moe-familys-blocks-dynjaxmodelsmoepy",
                     "b.py": "Depth: docs/moe.md#no-such-heading",
                     "c.py": "Depth: docs/nowhere.md#x",
                     "d.py": "Depth: results/routing_study/README.md#nothing"}) == \
        [("b.py", "docs/moe.md#no-such-heading"), ("c.py", "docs/nowhere.md#x"),
         ("d.py", "results/routing_study/README.md#nothing")]


def joined_lines(source: str) -> list:
    """Line numbers of a (non-raw) module docstring's lines that end in one backslash: Python
    joins them to the next, so a command shown as two lines reads as one padded line."""
    body = ast.parse(source).body
    if not body or not isinstance(getattr(body[0], "value", None), ast.Constant):
        return []
    lines = source.split("\n")[body[0].lineno - 1:body[0].end_lineno]
    if lines[0].lstrip().startswith(("r'", 'r"')):
        return []
    return [body[0].lineno + i for i, line in enumerate(lines) if re.search(r"(?<!\\)\\$", line)]


def test_commands_continued_in_a_docstring_keep_their_backslash():
    assert {str(p.relative_to(ROOT)): joined_lines(p.read_text())
            for p in sorted(ROOT.rglob("*.py")) if joined_lines(p.read_text())} == {}
    assert joined_lines('"""Run\n    a \\\n    b\n"""\n') == [2]
    assert joined_lines('"""Run\n    a \\\\\n    b\n"""\n') == []
