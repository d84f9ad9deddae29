"""The programs speak the form they were started in, answer --help before JAX loads, and
offer only configs as configs (the installed commands themselves: tests/integration/test_package.py)."""
import os
import subprocess
import sys

import pytest

from dynjax import configs, programs
from tests.conftest import ROOT

PROGRAMS = {"train": ("--config:", "--workdir:", "--progress:", "--coordinator_address:"),
            "audit": ("--config:", "--out:", "--checkpoints:", "--hf:"),
            "scorecard": ("--config:", "--out:", "--hf:"),
            "sample": ("--prompt:", "--max_new_tokens:", "--temperature:"),
            "plan": ("--config:", "--mesh:", "--preset:", "--device-memory:")}


def _run(args, cwd=ROOT, timeout=120):
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.subprocess
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_program_modules_import_no_jax(program):
    """What --help needs (the program module and its flags) loads without JAX or the
    program's library: that is why --help answers in well under a second."""
    out = _run(["-c", f"import sys, dynjax.programs.{program}; print(sorted(m for m in ("
                "'jax', 'flax', 'dynjax.train.loop', 'dynjax.audit.run', "
                "'dynjax.train.memory_plan', 'dynjax.scorecard') if m in sys.modules))"])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


@pytest.mark.subprocess
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_help_shows_the_installed_form_and_the_main_flags(program):
    out = _run([f"{program}.py", "--help"])
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"    dynjax-{program} " in out.stdout and f"python {program}.py" in out.stdout
    for flag in PROGRAMS[program]:
        assert f"\n  {flag} " in out.stdout, (flag, out.stdout)
    assert "jax_" not in out.stdout          # JAX's own flags are --helpfull's, not --help's


def test_configs_offered_are_configs():
    names = configs.names()
    assert "common" not in names and "mlp_common" not in names
    assert {"tiny", "audit_tiny", "scorecard", "dgmlp_mnist"} <= set(names)
    for name in names:
        assert "\ndef get_config(" in open(configs.path(name)).read(), name


@pytest.mark.subprocess
def test_a_checkout_config_path_outside_a_checkout_names_the_installed_form(tmp_path):
    out = _run([os.path.join(ROOT, "train.py"), "--config=configs/tiny.py:feature_gate",
                "--workdir=run"], cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    line, = out.stderr.strip().splitlines()
    assert line.startswith("train.py: error: bad command line: --config=configs/tiny.py:")
    assert "the installed form is --config=dynjax:tiny:feature_gate" in line
    out = _run([os.path.join(ROOT, "train.py"), "--config=configs/common.py", "--workdir=r"],
               cwd=tmp_path)
    assert out.returncode == 2 and "dynjax:NAME, NAME one of audit_dgmlp," in out.stderr
    assert "common," not in out.stderr and not (tmp_path / "run").exists()


def test_messages_speak_the_form_the_program_was_started_in(monkeypatch, tmp_path):
    from dynjax.audit.targets.train_runs import read_run_config
    from dynjax.errors import AuditError

    for started, expect in (("dynjax-sample", "`dynjax-train --config=dynjax:tiny:feature_gate "
                             "--workdir=runs/none`"),
                            ("sample.py", "`python train.py --config=configs/tiny.py:"
                             "feature_gate --workdir=runs/none`")):
        monkeypatch.setattr(configs, "STARTED_AS", started)
        with pytest.raises(AuditError) as e:
            read_run_config("runs/none")
        assert expect in str(e.value) and "Hugging Face cache" in str(e.value)
    monkeypatch.setattr(configs, "STARTED_AS", None)     # the library: where it lives
    assert programs.command("audit", "audit_tiny") == (
        "python audit.py --config=configs/audit_tiny.py" if configs.in_checkout()
        else "dynjax-audit --config=dynjax:audit_tiny")
