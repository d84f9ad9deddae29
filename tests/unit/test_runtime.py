"""One runtime set-up for every program dynjax starts: each entry point re-executes itself
under the allocator setting before JAX starts (dynjax/runtime.py; the mechanism's own test is
tests/integration/test_perf.py), and each benchmark's JSON records the settings it ran under."""
import ast
import pathlib

import pytest

from tests.conftest import ROOT

ROOT_P = pathlib.Path(ROOT)
PROGRAMS = sorted([*ROOT_P.glob("*.py"), *ROOT_P.glob("benchmarks/*.py"), *ROOT_P.glob("scripts/*.py"),
                   *ROOT_P.glob("experiments/*.py")])
LIBRARY_FILES = {"benchmarks/common.py", "benchmarks/__init__.py", "experiments/__init__.py",
                 "benchmarks/cpu_limit.py", "benchmarks/user_path.py",
                 "scripts/mutation_check.py"}   # imported helpers; the mutation check runs pytest


def _programs():
    return [p for p in PROGRAMS if str(p.relative_to(ROOT_P)) not in LIBRARY_FILES]


def _setup_index_and_first_heavy_import(tree):
    """(index of the top-level ``setup(__name__)`` call, index of the first top-level
    import of jax / flax / numpy / torch, or of a dynjax module other than runtime)."""
    setup_at = heavy_at = None
    for i, node in enumerate(tree.body):
        if (setup_at is None and isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "attr", getattr(node.value.func, "id", "")) == "setup"):
            setup_at = i
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        heavy = [n for n in names if n.split(".")[0] in ("jax", "flax", "numpy", "torch", "optax")
                 or (n.startswith("dynjax") and n not in ("dynjax", "dynjax.runtime"))]
        if heavy and heavy_at is None:
            heavy_at = i
    return setup_at, heavy_at


@pytest.mark.parametrize("path", _programs(), ids=lambda p: str(p.relative_to(ROOT_P)))
def test_every_program_starts_under_the_runtime_setting(path):
    setup_at, heavy_at = _setup_index_and_first_heavy_import(ast.parse(path.read_text()))
    assert setup_at is not None, f"{path.name} never calls setup(__name__)"
    assert heavy_at is None or setup_at < heavy_at, f"{path.name} imports JAX before setup"


@pytest.mark.parametrize("path", sorted(p for p in ROOT_P.glob("benchmarks/*.py")
                                        if '"command": command_line()' in p.read_text()),
                         ids=lambda p: p.name)
def test_every_benchmark_json_records_its_runtime(path):
    text = path.read_text()
    assert text.count('"command": command_line()') == text.count('"runtime": describe()')
