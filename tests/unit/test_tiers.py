"""The suite's two tiers stay what docs/contributing.md says: every test file is in tests/unit
(in process: the inner loop, ``scripts/test.sh --quick``) or tests/integration; no unit test
starts a process; an integration test that starts one carries the ``subprocess`` mark; file
names are unique (pytest imports each file by its name)."""
import ast
import collections
import pathlib

import pytest

from tests.conftest import ROOT

TESTS = pathlib.Path(ROOT, "tests")
FILES = sorted(TESTS.rglob("test_*.py"))
STARTS = {("subprocess", None), ("multiprocessing", None), ("sys", "executable"), ("os", "fork")}


def starts_one(node) -> bool:
    """Whether code names subprocess.*, multiprocessing.*, sys.executable or os.fork."""
    return any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and
               ({(n.value.id, None), (n.value.id, n.attr)} & STARTS) for n in ast.walk(node))


def starting_tests(tree: ast.Module) -> dict[str, bool]:
    """{test name: whether it starts a process} for a module's top-level tests, following
    the module's own functions it calls or takes as fixtures."""
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    starts = {name for name, f in funcs.items() if starts_one(f)}
    grew = True
    while grew:
        grew = False
        for name, f in funcs.items():
            used = {n.id for n in ast.walk(f) if isinstance(n, ast.Name)}
            if name not in starts and (used | {a.arg for a in f.args.args}) & starts:
                starts.add(name)
                grew = True
    return {name: name in starts for name in funcs if name.startswith("test_")}


def marked(node, tree) -> bool:
    module = [ast.unparse(n.value) for n in tree.body if isinstance(n, ast.Assign)
              and any(getattr(t, "id", None) == "pytestmark" for t in n.targets)]
    return any("mark.subprocess" in s for s in [*module, *map(ast.unparse, node.decorator_list)])


def test_every_test_file_is_in_a_tier_and_names_are_unique():
    assert FILES
    outside = [str(p.relative_to(TESTS)) for p in FILES
               if p.relative_to(TESTS).parts[0] not in ("unit", "integration")]
    assert outside == [], "put these in tests/unit or tests/integration"
    twice = [n for n, c in collections.Counter(p.name for p in FILES).items() if c > 1]
    assert twice == []


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(TESTS)))
def test_process_starts_are_marked_and_only_in_integration(path):
    tree = ast.parse(path.read_text())
    nodes = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    starting = [name for name, s in starting_tests(tree).items() if s]
    if path.relative_to(TESTS).parts[0] == "unit":
        assert starting == [], "a unit test starts a process: move it to tests/integration"
    assert [n for n in starting if not marked(nodes[n], tree)] == [], \
        "mark these @pytest.mark.subprocess"


def test_the_check_sees_a_start_through_a_helper_and_a_fixture():
    tree = ast.parse("import subprocess\n"
                     "def _run(): return subprocess.run(['true'])\n"
                     "def ran(): return _run()\n"
                     "def test_a(ran): pass\n"
                     "def test_b(): _run()\n"
                     "def test_c(): pass\n")
    assert starting_tests(tree) == {"test_a": True, "test_b": True, "test_c": False}
    marked_tree = ast.parse("import pytest\n@pytest.mark.subprocess\ndef test_a(): pass\n")
    assert marked(marked_tree.body[1], marked_tree)


def test_files_go_out_longest_first_and_stay_whole(tmp_path, monkeypatch):
    """tests/durations.json orders whole files longest first, a file it lacks first of all;
    each file's tests keep their order (module fixtures are built once per file)."""
    import json
    import types

    from tests import conftest

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "durations.json").write_text(json.dumps(
        {"seconds": {"tests/a.py": 5.0, "tests/b.py": 50.0, "tests/c.py": 1.0}}))
    monkeypatch.setattr(conftest, "ROOT", str(tmp_path))
    items = [types.SimpleNamespace(path=tmp_path / "tests" / f, name=f"{f}:{i}")
             for f, i in [("a.py", 0), ("c.py", 0), ("a.py", 1), ("b.py", 0), ("new.py", 0),
                          ("b.py", 1), ("c.py", 1)]]
    got = [it.name for it in conftest.file_order(items)]
    assert got == ["new.py:0", "b.py:0", "b.py:1", "a.py:0", "a.py:1", "c.py:0", "c.py:1"]
