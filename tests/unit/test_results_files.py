"""Committed results name their commands and no machine path; a results.json summary is
checked against what the current statistics code computes from the per-checkpoint values
stored in the same file (a stale figure is caught here; every file's check:
tests/integration/test_results_regenerate.py)."""
import json
import math
import pathlib
import re

import pytest

from dynjax.audit.summary import summarize_stored
from tests.conftest import ROOT

# audit results (the sweep's summary table is a results.json of another shape)
RESULTS = sorted(p for p in pathlib.Path(ROOT, "results").rglob("results.json")
                 if "conditions" in json.loads(p.read_text()))
FIELDS = ("estimate", "ci_low", "ci_high", "p", "p_holm")


def _same(stored, fresh):
    if stored is None:                       # NaN is written as null
        return fresh is None or not math.isfinite(fresh)
    return fresh is not None and math.isclose(stored, fresh, rel_tol=1e-9, abs_tol=1e-15)


def mismatches(results: dict) -> list[str]:
    """'section/name/field: stored X, recomputed Y' for every summary number that differs."""
    fresh = summarize_stored(results)
    if fresh is None:
        return []
    out = []
    for section in ("conditions", "effects"):
        for name, row in fresh[section].items():
            stored = results[section][name]
            pairs = [(f, stored.get(f), row.get(f)) for f in FIELDS if f in row]
            if "retention" in row:
                pairs += [(f"retention.{f}", stored["retention"].get(f), row["retention"][f])
                          for f in ("estimate", "ci_low", "ci_high")]
            out += [f"{section}/{name}/{f}: stored {a}, recomputed {b}"
                    for f, a, b in pairs if not _same(a, b)]
    return out


def test_there_are_results_to_check():
    assert len(RESULTS) >= 4, RESULTS




def test_a_stale_figure_is_caught():
    results = json.loads(RESULTS[0].read_text())
    name = next(iter(n for n in results["conditions"] if n != "correct"))
    results["conditions"][name]["p"] = 0.123456
    assert [m for m in mismatches(results) if m.startswith(f"conditions/{name}/p:")]


COMMANDS_INDEX = pathlib.Path(ROOT, "results", "COMMANDS.md")


def names_its_command(data) -> bool:
    """A top-level ``command``, an audit's ``meta.command``, or every section's own
    ``command`` (a file of several measurements, e.g. timings.json)."""
    if not isinstance(data, dict):
        return False
    if isinstance(data.get("command"), str) or isinstance(data.get("meta", {}).get("command"), str):
        return True
    sections = [v for v in data.values() if isinstance(v, dict)]
    return bool(sections) and all(isinstance(v.get("command"), str) for v in sections)


def indexed_paths() -> list[str]:
    """The paths (files, or directories ending in /) that results/COMMANDS.md gives commands for."""
    rows = [line.split("|") for line in COMMANDS_INDEX.read_text().splitlines()
            if line.startswith("| `results/")]
    return [row[1].strip().strip("`") for row in rows if row[2].strip()]


def test_every_results_json_names_the_command_that_made_it():
    indexed = indexed_paths()
    missing = []
    for path in sorted(pathlib.Path(ROOT, "results").rglob("*.json")):
        rel = path.relative_to(ROOT).as_posix()
        if not names_its_command(json.loads(path.read_text())) and not any(
                rel == p or (p.endswith("/") and rel.startswith(p)) for p in indexed):
            missing.append(rel)
    assert missing == [], f"add a command to these files or to results/COMMANDS.md: {missing}"


def test_commands_index_and_its_check_catch_an_unnamed_file():
    assert "results/main/" in indexed_paths()
    assert not names_its_command({"step_s": 1.0})
    assert not names_its_command({"a": {"command": "x"}, "b": {"step_s": 1.0}})
    assert names_its_command({"meta": {"command": "python audit.py"}})


def test_readme_hf_parity_row_equals_its_file():
    """The README's parity table is results/hf_parity.json, in its column order, to the three
    significant digits it prints."""
    arch = json.loads(pathlib.Path(ROOT, "results", "hf_parity.json").read_text())["architectures"]
    readme = pathlib.Path(ROOT, "README.md").read_text()
    header = re.search(r"^  \| (llama \|.*) \|$", readme, re.M).group(1).split(" | ")
    row = readme[readme.index("|---|", readme.index("| llama |")):].splitlines()[1]
    printed = [cell.strip() for cell in row.strip().strip("|").split("|")]
    assert printed == [f"{arch[name]['max_abs_logit_diff']:.2e}".replace("e-0", "e-")
                       for name in header]
    # the second table (DeepSeek ... Qwen3.5): every column named plainly by its fixture
    start = readme.index("| deepseek_v3 (")
    lines = readme[start:].splitlines()
    header = [c.strip() for c in lines[0].strip().strip("|").split("|")]
    printed = [c.strip() for c in lines[2].strip().strip("|").split("|")]
    plain = [(name, cell) for name, cell in zip(header, printed) if name in arch]
    assert {"qwen3_next", "qwen3_5_moe", "qwen3_5", "gemma4"} <= {name for name, _ in plain}
    for name, cell in plain:
        assert cell == f"{arch[name]['max_abs_logit_diff']:.2e}".replace("e-0", "e-"), name


# every JSON a benchmark wrote: the command that made it runs a program in benchmarks/
BENCHMARK_RESULTS = sorted(
    p for p in pathlib.Path(ROOT, "results").rglob("*.json")
    if re.match(r"python (-m )?benchmarks[./]", str(json.loads(p.read_text()).get("command", ""))))


def test_benchmark_results_exist():
    assert len(BENCHMARK_RESULTS) >= 15


@pytest.mark.parametrize("path", BENCHMARK_RESULTS, ids=lambda p: p.name)
def test_every_benchmark_result_names_its_runtime(path):
    """The allocator setting and XLA flags a figure was measured under (dynjax.runtime.runtime),
    or, for a figure measured before they were recorded, that they were not and why."""
    rt = json.loads(path.read_text()).get("runtime")
    assert isinstance(rt, dict), f"{path}: no runtime"
    if rt.get("recorded") is False:
        assert len(rt.get("why", "")) > 20, f"{path}: runtime not recorded and no reason given"
    else:
        assert {"GLIBC_TUNABLES", "XLA_FLAGS", "malloc", "cpu", "jax"} <= set(rt), path


# An absolute path of the machine that made a file: its work, scratch or users' folders
# (/work, /tmp, /home, /root, macOS /Users), not preceded by a word character, ":" or "/"
# (a URL's path, "runs/x", "nats/token" pass; a docs example such as --data_dir=/data/tfds
# or a shared /mnt/shared is an instruction, not a trace of this machine).
MACHINE_PATH = re.compile(r"(?<![\w:/.~-])/(?:work|tmp|home|root|Users)/[^\s\"'`)]*")
TEXT_SUFFIXES = {".json", ".md", ".txt", ".csv", ".svg", ".jsonl", ".yaml", ".toml"}


def machine_paths(text: str) -> list[str]:
    return MACHINE_PATH.findall(text)


def test_no_absolute_machine_path_under_results_or_docs():
    """Results and docs name runs relative to the working directory or by name (what
    dynjax.jsonio.portable writes), never by the absolute path of the machine that made
    them."""
    found = []
    for top in ("results", "docs"):
        for p in sorted(pathlib.Path(ROOT, top).rglob("*")):
            if p.is_file() and p.suffix in TEXT_SUFFIXES:
                found += [f"{p.relative_to(ROOT)}: {m}" for m in machine_paths(p.read_text())]
    assert found == [], "\n".join(found[:20])


def test_the_machine_path_check_and_the_writers_agree(tmp_path, monkeypatch):
    """The check catches what a writer used to write, lets URLs and relative paths pass, and
    a results writer makes absolute paths portable: relative inside the working directory,
    the name outside it."""
    from dynjax.jsonio import portable

    assert machine_paths('"run_dir": "/tmp/r2", "x": "/home/u/runs/a"') == \
        ["/tmp/r2", "/home/u/runs/a"]
    assert machine_paths("https://huggingface.co/work/x runs/fca/s0 nats/token") == []
    monkeypatch.chdir(tmp_path)
    cmd = f"audit.py --out={tmp_path}/results/a --checkpoints=/work/runs/s0,/work/runs/s1"
    assert portable({"run_dir": "/work/runs/mod_s0", "command": cmd, "n": 1.5}) == {
        "run_dir": "mod_s0", "command": "audit.py --out=results/a --checkpoints=s0,s1",
        "n": 1.5}
    snap = "/root/.cache/huggingface/hub/models--allenai--OLMoE-1B-7B-0924/snapshots/abc123"
    assert portable(f"dynjax-sample {snap} --prompt=x") == \
        "dynjax-sample allenai/OLMoE-1B-7B-0924@abc123 --prompt=x"   # the repo id, retypeable


def test_an_audit_report_names_its_run_without_a_machine_path(tmp_path):
    """write_report turns the absolute run_dir a target reports into a portable name, in
    results.json and report.md alike (the title takes the run's name)."""
    from dynjax.audit.report import write_report

    row = {"estimate": 0.01, "ci_low": 0.005, "ci_high": 0.02, "p": 0.01, "p_holm": 0.02}
    results = {"title": "t", "unit": "window", "replay": {"exact": True, "max_abs_dlogit": 0.0},
               "conditions": {"cross_input": row},
               "meta": {"checkpoints": [{"run_dir": "/work/runs/fca/feature_gate_s0",
                                         "note": "read from /home/u/runs/fca/feature_gate_s0"}],
                        "command": "python audit.py --checkpoints=/tmp/r2"}}
    out = write_report(results, tmp_path / "audit")
    text = (out / "results.json").read_text() + (out / "report.md").read_text()
    assert machine_paths(text) == []
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert meta["checkpoints"][0]["run_dir"] == "feature_gate_s0"
    assert meta["command"] == "python audit.py --checkpoints=r2"
