"""The package's layers run one way (data -> models -> train -> audit -> programs) and no
module imports itself back through others: read off every ``import`` in dynjax/ with ast,
lazy ones inside functions included, since they are arrows too."""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2] / "dynjax"
# Lowest first; a module may import its own layer or any layer below it. Each name is a
# top-level module or a whole folder: no module sits in a layer other than its folder's.
LAYERS = (("errors",), ("coeffs", "jsonio", "runtime", "figures"), ("data",), ("parallel",),
          ("models",), ("loaders", "decoding", "tasks"), ("measure",), ("runs",), ("train",),
          ("audit", "configs"), ("scorecard",), ("programs", "export"))
RANK = {part: i for i, layer in enumerate(LAYERS) for part in layer}
KNOWN_CYCLES = []


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: pathlib.Path) -> set[str]:
    """dynjax modules ``path`` imports (``from dynjax.x import y`` names y when y is a module)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "dynjax")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                node.module.split(".")[0] == "dynjax":
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                is_module = (ROOT.parent / (sub.replace(".", "/") + ".py")).exists() or \
                    (ROOT.parent / sub.replace(".", "/")).is_dir()
                out.add(sub if is_module else node.module)
    return out


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in ROOT.rglob("*.py")}


def layer(module: str) -> int:
    part = (module.split(".")[1:] or [module])[0]
    if part not in RANK:
        raise AssertionError(f"{module} is in no layer; add dynjax/{part} to LAYERS")
    return RANK[part]


def upward_arrows(g) -> list[str]:
    return sorted(f"{a} -> {b}" for a, bs in g.items() for b in bs
                  if b != "dynjax" and layer(b) > layer(a))


def cycles(g) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in g:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_upward_arrows():
    assert upward_arrows(graph()) == []


def test_no_import_cycles():
    assert [c for c in cycles(graph()) if c not in KNOWN_CYCLES] == []


def test_the_check_sees_an_upward_arrow_and_a_cycle():
    g = {"dynjax.models.a": {"dynjax.train.b"}, "dynjax.train.b": {"dynjax.models.a"}}
    assert upward_arrows(g) == ["dynjax.models.a -> dynjax.train.b"]
    assert cycles(g) == [["dynjax.models.a", "dynjax.train.b"]]


def test_scorecard_is_a_folder_with_top_level_imports():
    """issue 28: the scorecard is dynjax/scorecard/ (panels, run, report), each module's
    imports at its top (the old 526-line module had 14 function-local ones), and the package
    still answers to ``dynjax.scorecard.<name>`` for every public name."""
    folder = ROOT / "scorecard"
    assert {p.stem for p in folder.glob("*.py")} >= {"__init__", "panels", "run", "report"}
    assert not (ROOT / "scorecard.py").exists()
    for path in folder.glob("*.py"):
        tree = ast.parse(path.read_text())
        for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
            local = [n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
            assert not local, f"{path.name}:{fn.name} imports inside the function"
    from dynjax import scorecard
    for name in ("score", "write", "plot", "render_markdown", "verdicts", "variation",
                 "dependence", "input_share", "PANEL_CONDITIONS"):
        assert callable(getattr(scorecard, name)) or name.isupper()
