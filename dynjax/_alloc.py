"""The C allocator setting XLA:CPU needs, applied by re-executing an entry point once.

XLA:CPU allocates its large temporaries afresh on every execution; above glibc's mmap
threshold each one is a fresh mapping whose 4 KB pages fault in one by one (about 3 GB of
faults per d=256, T=1024 train step). ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` has malloc
ask for transparent huge pages instead (512x fewer faults). glibc reads it only when a
process starts, so ``train.py``, ``train_mlp.py``, ``audit.py`` and the benchmarks call
``reexec(__name__)`` before anything else: when run as a program without the setting, they
replace themselves with the same command line and the setting added. Benchmark figures:
``benchmarks/alloc_speed.py``. ``DYNJAX_MALLOC=system`` keeps the process as started.
"""
import os
import sys

TUNABLE = "glibc.malloc.hugetlb=1"


def environment(env=None) -> dict:
    """``env`` (default: os.environ) with the tunable added to GLIBC_TUNABLES."""
    env = dict(os.environ if env is None else env)
    if TUNABLE not in env.get("GLIBC_TUNABLES", ""):
        env["GLIBC_TUNABLES"] = ":".join(filter(None, [env.get("GLIBC_TUNABLES"), TUNABLE]))
    return env


def reexec(module_name: str):
    """Re-execute this program with the tunable set, if it is the main program on Linux and
    the tunable is missing; otherwise (imported, e.g. by a test) do nothing."""
    if (module_name != "__main__" or not sys.platform.startswith("linux")
            or os.environ.get("DYNJAX_MALLOC") == "system"
            or TUNABLE in os.environ.get("GLIBC_TUNABLES", "")):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable] + sys.orig_argv[1:], environment())
