"""One runtime set-up for every program dynjax starts: each entry point re-executes itself
under the allocator setting before JAX starts (dynjax/runtime.py; the mechanism's own test is
tests/integration/test_perf.py), and each benchmark's JSON records the settings it ran under."""
import ast
import pathlib
import sys

import pytest

from dynjax import runtime
from tests.conftest import ROOT

ROOT_P = pathlib.Path(ROOT)
PROGRAMS = sorted([*ROOT_P.glob("*.py"), *ROOT_P.glob("benchmarks/*.py"), *ROOT_P.glob("scripts/*.py"),
                   *ROOT_P.glob("experiments/*.py")])
LIBRARY_FILES = {"benchmarks/common.py", "benchmarks/__init__.py", "experiments/__init__.py",
                 "benchmarks/cpu_limit.py", "benchmarks/user_path.py", "benchmarks/hf_gemm_bound.py",
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


def _thp_disabled() -> int:
    import ctypes
    return ctypes.CDLL(None).prctl(runtime.PR_GET_THP_DISABLE, 0, 0, 0, 0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_ordinary_pages_turns_huge_pages_off_and_back():
    before = _thp_disabled()
    with runtime.ordinary_pages():
        assert _thp_disabled() == 1
    assert _thp_disabled() == before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_checkpoint_is_read_in_ordinary_pages(tmp_path, monkeypatch):
    """hf.load reads and places every tensor with huge pages off (10-20 s of kernel time
    for a 2 GB load with them; docs/hf.md), and turns them back on for what follows."""
    from benchmarks import hf_load
    from dynjax.loaders import hf

    shape = {**hf_load.SHAPES["llama"], "vocab_size": 256, "hidden_size": 64,
             "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 16}
    hf_load.make(str(tmp_path), 0.001, shape)
    seen, read = [], hf.Tensors._raw
    monkeypatch.setattr(hf.Tensors, "_raw", lambda self, *a, **k: (
        seen.append(_thp_disabled()), read(self, *a, **k))[1])
    before = _thp_disabled()
    hf.load(str(tmp_path))
    assert seen and set(seen) == {1} and _thp_disabled() == before


def test_random_bits_are_jaxs_own_through_the_unrolled_hash():
    """dynjax.models lowers threefry unrolled on the CPU: no rolled loop in a draw's program,
    and every draw (bits, normals, truncated normals, splits; odd and empty shapes) is bit
    for bit what JAX's own CPU lowering gives."""
    import chex
    import jax

    import dynjax.models  # noqa: F401  (applies it)

    def draws():
        key = jax.random.key(7)
        return jax.jit(lambda k: {
            "bits": jax.random.bits(k, (3, 37)), "normal": jax.random.normal(k, (1001,)),
            "truncated": jax.random.truncated_normal(k, -2.0, 2.0, (5, 7)),
            "split": jax.random.key_data(jax.random.split(k, 5)),
            "empty": jax.random.uniform(k, (0, 3)), "scalar": jax.random.normal(k, ())})(key)

    text = jax.jit(lambda k: jax.random.bits(k, (4,))).lower(jax.random.key(0)).as_text()
    assert "stablehlo.while" not in text
    unrolled = draws()
    assert runtime.unroll_threefry_on_cpu(unroll=False)      # JAX's own rolled loop
    try:
        assert "stablehlo.while" in jax.jit(lambda k: jax.random.bits(k, (4,))).lower(
            jax.random.key(0)).as_text()
        rolled = draws()
    finally:
        runtime.unroll_threefry_on_cpu()
    chex.assert_trees_all_equal(unrolled, rolled)
