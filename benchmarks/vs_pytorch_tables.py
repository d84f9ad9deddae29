"""The four tables of docs/performance.md, rendered from a vs_pytorch.py JSON, so the page
shows what the file says (tests/unit/test_docs.py checks that it does).

    python -m benchmarks.vs_pytorch_tables results/vs_pytorch.json           # print them
    python -m benchmarks.vs_pytorch_tables results/vs_pytorch.json --write   # into the page

Torch-free: the goals live here, and vs_pytorch.py (which needs torch) reads them.
"""
from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import json
import pathlib
import sys

ROWS = [(v, name) for v in ("dense", "mod") for name in ("train", "forward")]
LABEL = {"dense": "dense", "mod": "MoD", "train": "train step", "forward": "forward"}
# Goals (issue 32), on the user path: train.py's loop step and its validation forward.
GOALS = {"train_ge_1.5x_eager": ("train", "torch_eager", 1.5),
         "train_ge_1.25x_compile": ("train", "torch_compile", 1.25),
         "forward_ge_1.75x_eager": ("forward", "torch_eager", 1.75)}
GOAL = {(name, other): need for name, other, need in GOALS.values()}
PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "performance.md"
BREAKDOWN = [("matmul", "matmuls (dots and the fusions around them)"),
             ("attention_softmax", "attention softmax (scale, mask, logsumexp, exp)"),
             ("elementwise", "elementwise (norms, GELU, rotary, residuals, loss)"),
             ("gather_scatter_copy", "gather / scatter / copy (MoD routing, layout)"),
             ("optimizer", "optimizer (AdamW, clipping, gradient norm)"),
             ("guard", "non-finite guard"),
             ("other", "other (unclassified instructions)"),
             ("data_host", "data and host, not overlapped")]


def _ratio(r, key, name):
    value = r.get(key, {}).get(name)
    return "" if value is None else f"{value:.2f}"


def _goal(r, key, name, other):
    need = GOAL.get((name, other))
    if need is None:
        return ""
    value = r.get(key, {}).get(name)
    return f"≥ {need}" + ("" if value is None else (": met" if value >= need else ": missed"))


def isolated_table(res) -> list[str]:
    out = ["| T={seq_len}, batch {batch_size}, f32 | dynjax / PyTorch eager, tokens/s | goal | "
           "dynjax / torch.compile |".format(**res), "|---|---|---|---|"]
    for v, name in ROWS:
        r = res[v]
        out.append(f"| {LABEL[v]}, {LABEL[name]} | **{_ratio(r, 'dynjax_over_torch_eager', name)}**"
                   f" ({r['dynjax'][name + '_s']:.3f} s vs {r['torch_eager'][name + '_s']:.3f} s)"
                   f" | {_goal(r, 'dynjax_over_torch_eager', name, 'torch_eager')} | "
                   f"{_ratio(r, 'dynjax_over_torch_compile', name)} |")
    return out


def user_path_table(res) -> list[str]:
    out = ["| T={seq_len}, batch {batch_size}, f32 | user path, s | isolated step, s | user / "
           "isolated | user path / PyTorch eager | goal | user path / torch.compile | goal |"
           .format(**res), "|---|---|---|---|---|---|---|---|"]
    for v, name in ROWS:
        r = res[v]
        out.append(f"| {LABEL[v]}, {LABEL[name]} | {r['dynjax_loop'][name + '_s']:.3f} | "
                   f"{r['dynjax'][name + '_s']:.3f} | {_ratio(r, 'user_path_over_isolated', name)}"
                   f" | **{_ratio(r, 'user_path_over_torch_eager', name)}** | "
                   f"{_goal(r, 'user_path_over_torch_eager', name, 'torch_eager')} | "
                   f"{_ratio(r, 'user_path_over_torch_compile', name)} | "
                   f"{_goal(r, 'user_path_over_torch_compile', name, 'torch_compile')} |")
    return out


def limit_table(res) -> list[str]:
    fws = ("dynjax_loop", "dynjax", "torch_eager", "torch_compile")
    peak = res["gemm"]["peak_flops_per_s"] / 1e9
    out = [f"| T={res['seq_len']}, batch {res['batch_size']}, f32 | model GFLOP | matmul bound, s "
           f"| MFU of {peak:.1f} GFLOP/s (bound fraction): dynjax user path | dynjax isolated | "
           "PyTorch eager | torch.compile |", "|---|---|---|---|---|---|---|"]
    for v, name in ROWS:
        m = res["mfu"][v]
        cells = []
        for fw in fws:
            row = m["rows"].get(fw, {}).get(name)
            cells.append("" if row is None else
                         f"{row['mfu']:.0%} ({row['matmul_bound_fraction']:.2f})")
        out.append(f"| {LABEL[v]}, {LABEL[name]} | {m['model_flops'][name] / 1e9:.1f} | "
                   f"{m['matmul_bound_s'][name]:.3f} | " + " | ".join(cells) + " |")
    return out


def breakdown_table(res) -> list[str]:
    prof = res["profile"]
    out = ["| seconds per step | dense | MoD |", "|---|---|---|"]
    for key, label in BREAKDOWN + [("loop_step_s", "loop step (traced)")]:
        cells = []
        for v in ("dense", "mod"):
            p = prof.get(v) or {}
            value = p.get(key) if key == "loop_step_s" else p.get("step_breakdown_s", {}).get(key)
            cells.append("" if value is None else f"{value:.3f}")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out


TABLES = (isolated_table, user_path_table, limit_table, breakdown_table)
# the words in each table's header that find it on the page (its sizes and peak may change)
HEADER_WORDS = ("dynjax / PyTorch eager, tokens/s", "user path, s", "model GFLOP",
                "seconds per step")


def render(res) -> str:
    return "\n\n".join("\n".join(table(res)) for table in TABLES)


def write(res, page: pathlib.Path = PAGE) -> None:
    """Replace each table on ``page`` (the run of ``|`` lines whose header has its words) with
    the one rendered from ``res``; written atomically. A table not found is an error."""
    from dynjax.jsonio import write_text_atomic
    lines = page.read_text().splitlines()
    for table, words in zip(TABLES, HEADER_WORDS):
        start = next((i for i, line in enumerate(lines)
                      if line.startswith("|") and words in line), None)
        if start is None:
            raise SystemExit(f"vs_pytorch_tables: no table headed '{words}' in {page}; "
                             "put its header line back and rerun")
        end = start
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        lines[start:end] = table(res)
    write_text_atomic(page, "\n".join(lines) + "\n")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--write"]
    res = json.load(open(args[0] if args else "results/vs_pytorch.json"))
    write(res) if "--write" in sys.argv[1:] else print(render(res))
