"""The runtime setting every dynjax program starts under: ``setup(__name__)``, called before
JAX is imported, re-executes a program once with the C allocator setting XLA:CPU needs.

glibc reads ``GLIBC_TUNABLES`` only when a process starts, and with transparent huge pages
XLA:CPU's per-execution temporaries fault in 200x fewer pages; imported (not the main
program), ``setup`` does nothing. ``DYNJAX_MALLOC`` chooses hugetlb (default), retain,
jemalloc or system; :func:`describe` is what a benchmark's JSON records.
:func:`unroll_threefry_on_cpu` (applied by ``dynjax.models``) draws random bits on the CPU
through JAX's unrolled hash, as on accelerators: the same bits, faster. Why and the figures:
docs/training.md (The runtime setting).
"""
import contextlib
import ctypes
import os
import sys

HUGETLB = "glibc.malloc.hugetlb=1"
RETAIN = f"{HUGETLB}:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold={16 << 30}"
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
SETTINGS = {"system": {},
            "hugetlb": {"GLIBC_TUNABLES": HUGETLB},
            "retain": {"GLIBC_TUNABLES": RETAIN},
            "jemalloc": {"LD_PRELOAD": JEMALLOC,
                         "MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1,retain:true"}}
DEFAULT = "hugetlb"
_APPLIED = "DYNJAX_MALLOC_APPLIED"
_SEPARATOR = {"GLIBC_TUNABLES": ":", "LD_PRELOAD": " "}


def environment(setting: str, env=None) -> dict:
    """``env`` (default: os.environ) with ``setting``'s variables added (GLIBC_TUNABLES and
    LD_PRELOAD extended by the parts they lack, not replaced)."""
    env = dict(os.environ if env is None else env)
    for name, value in SETTINGS[setting].items():
        sep = _SEPARATOR.get(name)
        if sep and env.get(name):
            have = env[name].split(sep)
            value = sep.join(have + [part for part in value.split(sep) if part not in have])
        env[name] = value
    return env


def applied(setting: str, env=None) -> bool:
    """Whether ``env`` (default: os.environ) already has everything ``setting`` sets."""
    return environment(setting, env) == dict(os.environ if env is None else env)


def setup(module_name: str):
    """Re-execute this program with the chosen setting, if it is the main program on Linux
    and has not been re-executed yet; otherwise (imported, e.g. by a test) do nothing."""
    setting = os.environ.get("DYNJAX_MALLOC", DEFAULT)
    if setting not in SETTINGS:
        raise SystemExit(f"DYNJAX_MALLOC={setting!r}; use one of {sorted(SETTINGS)}")
    if (module_name != "__main__" or not sys.platform.startswith("linux")
            or os.environ.get(_APPLIED) or applied(setting)
            or (setting == "jemalloc" and not os.path.exists(JEMALLOC))):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    env = dict(environment(setting), **{_APPLIED: setting})
    os.execve(sys.executable, [sys.executable] + sys.orig_argv[1:], env)


def unroll_threefry_on_cpu(unroll: bool = True) -> bool:
    """Lower JAX's threefry2x32 hash on the CPU unrolled, as JAX does on every other platform
    (on the CPU it emits a rolled loop of the five rounds); ``unroll=False`` puts JAX's rolled
    loop back (what a test or benchmark compares with). The hash is integer arithmetic, so
    every random bit is the same; XLA:CPU draws 4096 x 4096 normals 3.6x faster, and a
    shipped tiny model's first init compiles in 0.5-1.0x the CPU time (results/init_time.json).
    Uses JAX's private lowering table: where that has moved, nothing changes (returns False)."""
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32
        rule = (threefry2x32._threefry2x32_lowering_rule if unroll
                else threefry2x32._threefry2x32_cpu_lowering_rule)
        primitive = threefry2x32.threefry2x32_p
    except (ImportError, AttributeError):
        return False
    mlir.register_lowering(primitive, rule, platform="cpu")
    return True


PR_SET_THP_DISABLE, PR_GET_THP_DISABLE = 41, 42   # linux/prctl.h


@contextlib.contextmanager
def ordinary_pages():
    """No transparent huge pages for the memory this process faults in inside the block
    (Linux ``prctl(PR_SET_THP_DISABLE)``, restored after; elsewhere nothing). A checkpoint
    load fills gigabytes of fresh memory beside a page cache holding its files, and the
    huge pages ``setup`` asks for then make the kernel compact memory at each fault: a
    2 GB bfloat16 load took 10-20 s, nearly all in the kernel, against 3-4 s in ordinary pages."""
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
    before = libc.prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) if libc is not None else -1
    if before < 0 or libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
        yield
        return
    try:
        yield
    finally:
        libc.prctl(PR_SET_THP_DISABLE, before, 0, 0, 0)


def describe() -> dict:
    """The settings this process runs under, for a benchmark's JSON: the allocator, XLA's
    flags, the machine and the library versions, so a figure says what measured it."""
    import platform

    import jax

    from dynjax.jsonio import versions
    info = _cpuinfo()
    flags = f" {info.get('flags', '')}"
    return {"malloc": os.environ.get(_APPLIED) or os.environ.get("DYNJAX_MALLOC", DEFAULT),
            **{name: os.environ.get(name, "") for name in
               ("GLIBC_TUNABLES", "LD_PRELOAD", "XLA_FLAGS", "JAX_PLATFORMS")},
            **versions(), "jax": jax.__version__, "backend": jax.default_backend(),
            "cpu": info.get("model name") or platform.processor(),
            "avx512": " avx512f" in flags, "amx": " amx_tile" in flags,
            # a VM's model string hides which CPU it is; these tell two machines apart
            **{name: info.get(key, "") for name, key in (
                ("cpu_family", "cpu family"), ("cpu_model", "model"), ("cpu_stepping", "stepping"),
                ("cpu_cache", "cache size"), ("cpu_mhz", "cpu MHz"))},
            "cores": os.cpu_count()}


def _cpuinfo() -> dict:
    """The first processor's ``key : value`` lines of /proc/cpuinfo ({} where there is none)."""
    if not os.path.exists("/proc/cpuinfo"):
        return {}
    info = {}
    for line in open("/proc/cpuinfo"):
        key, sep, value = line.partition(":")
        if sep and key.strip() not in info:
            info[key.strip()] = value.strip()
    return info
