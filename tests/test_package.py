"""The package's own metadata agrees with itself, and the built wheel works installed."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest

import dynjax
from dynjax.data import text
from tests.conftest import ROOT


def test_version_is_the_projects():
    project = tomllib.loads(pathlib.Path(ROOT, "pyproject.toml").read_text())["project"]
    assert dynjax.__version__ == project["version"]


def test_licence_file_is_the_declared_licence():
    project = tomllib.loads(pathlib.Path(ROOT, "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert "Apache License" in pathlib.Path(ROOT, "LICENSE").read_text()[:200]


def test_programs_import_configs_through_the_package():
    """``python experiments/X.py`` puts experiments/ on sys.path, not the checkout, so the
    checkout's ``configs`` link is not importable there: a program that imports it fails at
    its first use (the sweep's audit did, after a seed had trained)."""
    import re
    bare = re.compile(r"^\s*(from configs import|import configs\b)|import_module\(f?[\"']configs\.",
                      re.M)
    found = [str(p.relative_to(ROOT)) for d in ("experiments", "benchmarks", "scripts")
             for p in sorted(pathlib.Path(ROOT, d).glob("*.py")) if bare.search(p.read_text())]
    assert found == [], f"import dynjax.configs instead of configs in {found}"


# ------------------------------------------------------------------ the wheel, installed

TINY = ["--config.model.d_model=32", "--config.model.n_heads=2", "--config.model.d_ff=64",
        "--config.model.n_layers=2", "--config.data.seq_len=32", "--config.train.batch_size=4",
        "--config.train.steps=2", "--config.train.warmup_steps=1", "--config.train.log_every=1",
        "--config.train.ckpt_every=2", "--config.eval.windows=4", "--config.eval.batch_size=4",
        "--noprogress"]
AUDIT = ["--config.reassignments=2", "--config.batch_size=4", "--config.data.calib_windows=2",
         "--config.data.eval_windows=4", "--config.data.seq_len=32",
         "--config.stats.n_resamples=19"]


def _site_packages(prefix: pathlib.Path) -> pathlib.Path:
    return prefix / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


@pytest.mark.timeout(900)
def test_the_wheel_installs_and_its_commands_run_outside_the_checkout(tmp_path):
    """pip builds the wheel; a fresh venv (which sees this environment's site-packages
    through a .pth, so JAX is not installed again) installs it with --no-deps; from a
    folder outside the checkout the console commands train, audit, score, sample and plan
    a tiny model, the configs addressed as dynjax:NAME. The package has no top-level
    ``configs`` and its data folder is not in site-packages."""
    def run(args, cwd, timeout=300, **env):
        out = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                             timeout=timeout, env={**ENV, **env})
        assert out.returncode == 0, f"{args[0]}: {out.stdout[-2000:]}{out.stderr[-3000:]}"
        return out.stdout

    here = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    ENV = dict(here, JAX_PLATFORMS="cpu", PIP_DISABLE_PIP_VERSION_CHECK="1",
               DYNJAX_DATA=str(text.data_dir()))   # the checkout's fetched data, read only
    src = tmp_path / "src"    # what the wheel is built from, so no build files land in ROOT
    shutil.copytree(pathlib.Path(ROOT, "dynjax"), src / "dynjax",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(pathlib.Path(ROOT, name), src / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path / "dist", src],
        tmp_path, timeout=600)
    wheel, = (tmp_path / "dist").glob("dynjax-*.whl")
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist()}
    assert "configs" not in tops and "dynjax" in tops and any(t.endswith(".dist-info") for t in tops)

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path)
    site = _site_packages(venv)
    (site / "_dynjax_test_base.pth").write_text(f"{_site_packages(pathlib.Path(sys.prefix))}\n")
    py, bin_ = venv / "bin" / "python", venv / "bin"
    # --ignore-installed: pip leaves this environment's own (editable) dynjax alone
    run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed",
         wheel], tmp_path)

    work = tmp_path / "work"
    work.mkdir()
    where = run([py, "-c", "import importlib.util as u, dynjax; print(dynjax.__file__); "
                 "print(u.find_spec('configs'))"], work)
    assert where.splitlines()[0].startswith(str(site)) and where.splitlines()[1] == "None"
    cache = run([py, "-c", "import dynjax.data.text as t; print(t.data_dir())"], work,
                DYNJAX_DATA="", XDG_CACHE_HOME=str(tmp_path / "cache")).strip()
    assert cache == str(tmp_path / "cache" / "dynjax" / "data")

    out = run([bin_ / "dynjax-train", "--config=dynjax:tiny:feature_gate", "--workdir=run",
               *TINY], work)
    assert "test" in out and (work / "run" / "eval.json").exists()
    run([bin_ / "dynjax-audit", "--config=dynjax:audit_tiny", "--out=audit", "--checkpoints",
         "run", *AUDIT], work)
    meta = json.loads((work / "audit" / "results.json").read_text())["meta"]
    assert meta["command"].startswith("dynjax-audit --config=dynjax:audit_tiny ")  # retypable
    run([bin_ / "dynjax-scorecard", "--out=card", "run",
         *[a.replace("--config.", "--config.audit.") for a in AUDIT],
         "--config.execution_windows=2", "--config.latency_batches=1,",
         "--config.latency_repeats=1", "--config.thresholds.latency_batch=1"], work)
    assert (work / "card" / "scorecard.json").exists()
    out = run([bin_ / "dynjax-sample", "run", "--prompt=The ", "--max_new_tokens=4"], work)
    assert out.startswith("The ")
    out = run([bin_ / "dynjax-plan", "--config=dynjax:tiny:feature_gate", "--out=plan.json"],
              work)
    assert "fits" in out and json.loads((work / "plan.json").read_text())["preset"] == "dp"
    bad = subprocess.run([bin_ / "dynjax-train", "--config=dynjax:nonesuch", "--workdir=x"],
                         cwd=work, capture_output=True, text=True, timeout=120, env=ENV)
    assert bad.returncode == 2 and "dynjax-train: error: bad command line: --config=" \
        "dynjax:nonesuch: no config 'nonesuch'" in bad.stderr
