"""What a started program records about itself, checked in processes of their own: the
command line a user retypes (also after runtime.setup's re-execution), the allocator setting and
XLA flags of its runtime, and dynjax's version and commit (``git describe``). The in-process
halves: tests/unit/test_jsonio.py, tests/unit/test_runtime.py, tests/unit/test_results_files.py."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.subprocess
@pytest.mark.parametrize("how", ["module", "path", "module_reexec"])
def test_command_line_is_the_command_a_user_retypes(tmp_path, how):
    """A results file names the command that made it: ``-m`` stays ``-m`` (also after
    runtime.setup's re-execution, where sys.argv[0] becomes a path), a script path stays a path
    relative to where it ran, and arguments are shell-quoted."""
    pkg = tmp_path / "bench"
    pkg.mkdir()
    reexec = "from dynjax import runtime\nruntime.setup(__name__)\n" if "reexec" in how else ""
    (pkg / "probe.py").write_text(f"{reexec}import os\nfrom dynjax.jsonio import command_line\n"
                                  "print(os.environ.get('DYNJAX_MALLOC_APPLIED'))\n"
                                  "print(command_line())\n")
    program = ["bench/probe.py"] if how == "path" else ["-m", "bench.probe"]
    env = {k: v for k, v in os.environ.items() if k not in ("DYNJAX_MALLOC_APPLIED",)}
    env["DYNJAX_MALLOC"] = "retain" if "reexec" in how else "system"
    out = subprocess.run([sys.executable, *program, "--label", "two words"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120, check=True)
    applied, line = out.stdout.strip().splitlines()
    assert applied == ("retain" if "reexec" in how else "None")   # it did re-execute
    shown = "bench/probe.py" if how == "path" else "-m bench.probe"
    assert line == f"python {shown} --label 'two words'"


@pytest.mark.subprocess
def test_runtime_names_the_allocator_and_xla_flags():
    env = {k: v for k, v in os.environ.items()
           if k not in ("GLIBC_TUNABLES", "DYNJAX_MALLOC", "DYNJAX_MALLOC_APPLIED")}
    env["XLA_FLAGS"] = "--xla_cpu_enable_fast_math=false"
    code = ("from dynjax.runtime import describe, setup; setup(__name__); import json; "
            "print(json.dumps(describe()))")
    out = json.loads(subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, timeout=120,
                                    capture_output=True, text=True, check=True).stdout)
    assert out["malloc"] == "hugetlb" and out["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    assert out["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false"
    assert out["backend"] == "cpu" and out["cores"] >= 1 and out["jax"]


@pytest.mark.subprocess
def test_results_writers_record_dynjax_version_and_commit():
    """Every results JSON the programs write carries dynjax's version and the commit beside
    jax's (``jsonio.versions``: ``git describe`` in a checkout)."""
    import jax

    import dynjax
    from dynjax.runtime import describe
    from dynjax.jsonio import stamp, versions

    v = versions()
    described = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
    assert v == {"dynjax": dynjax.__version__, "commit": described or "unknown",
                 "jax": jax.__version__}
    assert stamp()["versions"] == v and describe()["commit"] == v["commit"]
