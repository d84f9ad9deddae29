"""Many hosts on JAX's multi-controller runtime: start-up, per-host data, who writes.

Every host runs the same command; :func:`initialize` calls ``jax.distributed.initialize``
(explicit flags, or ``--distributed`` for what JAX detects), else nothing. Each process
builds only its rows of a step's batch (:func:`local_rows`, :func:`put_rows`), so the batch
is the same for any number of processes; process 0 alone writes (:func:`is_main`).
Details: docs/multihost.md (Many hosts: start-up, data, output).
"""
from __future__ import annotations

import os
import sys
import threading

import jax
import numpy as np

from dynjax.errors import ConfigError


def initialize_from_flags(flags) -> None:
    f = flags.FLAGS
    initialize(f.coordinator_address, f.num_processes, f.process_id, f.distributed)


def initialize(coordinator_address=None, num_processes=None, process_id=None,
               auto: bool = False, timeout_s: int = 300) -> bool:
    """``jax.distributed.initialize`` from the flags; False (nothing done) without them.
    Inconsistent flags are a :class:`ConfigError` (one line)."""
    explicit = [coordinator_address, num_processes, process_id]
    if auto and any(v is not None for v in explicit):
        raise ConfigError("pass either --distributed (the cluster supplies the addresses) or "
                          "--coordinator_address/--num_processes/--process_id, not both")
    if not auto and all(v is None for v in explicit):
        return False
    if not auto:
        if any(v is None for v in explicit):
            raise ConfigError("--coordinator_address, --num_processes and --process_id go "
                              "together; give all three (or --distributed on a cluster JAX "
                              "detects)")
        if ":" not in coordinator_address:
            raise ConfigError(f"--coordinator_address={coordinator_address!r} must be HOST:PORT")
        if num_processes < 1 or not 0 <= process_id < num_processes:
            raise ConfigError(f"--process_id={process_id} must be in 0..{num_processes - 1} "
                              f"(--num_processes={num_processes})")
    if _cpu_only():
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs = {} if auto else dict(coordinator_address=coordinator_address,
                                  num_processes=num_processes, process_id=process_id)
    where = ("the cluster's coordinator" if auto else
             f"{num_processes} processes at {coordinator_address}")
    print(f"waiting for {where} (timeout {timeout_s} s)", file=sys.stderr, flush=True)
    # JAX's own timeout aborts the process with a C++ stack after minutes of silence: ours
    # comes first and is one line (os._exit: the runtime's threads are stuck in the wait)
    watchdog = threading.Timer(timeout_s, _timed_out, args=(where, timeout_s))
    watchdog.daemon = True
    watchdog.start()
    try:
        jax.distributed.initialize(**kwargs, initialization_timeout=timeout_s + GRACE_S)
    except (RuntimeError, ValueError) as e:   # jaxlib raises XlaRuntimeError (a RuntimeError)
        why = " ".join(str(e).split())[:300]
        raise ConfigError(f"jax.distributed.initialize failed ({why}); check that every "
                          "process got the same --coordinator_address and --num_processes, "
                          "distinct --process_id values, and that process 0 is reachable")
    finally:
        watchdog.cancel()
    if not auto and jax.process_count() != num_processes:
        raise ConfigError(f"--num_processes={num_processes} but the runtime reports "
                          f"{jax.process_count()} processes")
    if not is_main():
        quiet_others()
    return True


GRACE_S = 30   # JAX's own timeout, after ours


def _timed_out(where: str, timeout_s: int) -> None:
    from dynjax.errors import exit_with_error

    exit_with_error(sys.argv[0].rsplit("/", 1)[-1] or "dynjax", (
        f"timed out after {timeout_s} s waiting for {where}: start every process (the same "
        "--coordinator_address and --num_processes, each its own --process_id), check that "
        "process 0's address is reachable from this host, and run again"))


def _cpu_only() -> bool:
    """True when JAX will run on the CPU (checked without starting a backend)."""
    platforms = os.environ.get("JAX_PLATFORMS", "") or str(jax.config.jax_platforms or "")
    if platforms:
        return platforms.split(",")[0].strip() == "cpu"
    import importlib.util
    return not any(importlib.util.find_spec(m) for m in ("jax_cuda12_plugin", "jax_cuda13_plugin",
                                                         "libtpu", "jax_rocm60_plugin"))


def is_main() -> bool:
    """Process 0: the one that writes files, logs and the progress bar."""
    return jax.process_index() == 0


def quiet_others() -> None:
    """On processes other than 0: stdout (Python's and the C++ runtime's, e.g. gloo's
    connection lines) goes nowhere; stderr, where errors go, stays."""
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):   # a captured stream (e.g. under pytest)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  kept for the process's life
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


# ------------------------------------------------------------------ per-host rows

def local_rows(sharding, n_rows: int) -> np.ndarray:
    """The row indices (of a global ``[n_rows, ...]`` array under ``sharding``) that this
    process's devices hold, in the order ``make_array_from_process_local_data`` expects
    (ascending; rows that two local devices share appear once)."""
    idx = sharding.addressable_devices_indices_map((n_rows,))
    rows = set()
    for index in idx.values():
        sl = index[0]
        rows.update(range(*sl.indices(n_rows)))
    return np.array(sorted(rows), dtype=np.int64)


def put_rows(sharding, make_rows, n_rows: int):
    """The global array whose rows ``r`` are ``make_rows(r)`` (a pytree of numpy arrays with
    leading axis ``len(r)``), built from this process's rows only."""
    rows = local_rows(sharding, n_rows)
    local = make_rows(rows)
    return jax.tree.map(
        lambda a: jax.make_array_from_process_local_data(
            sharding, np.asarray(a), (n_rows,) + np.shape(a)[1:]), local)


def put_global(sharding, batch):
    """A host array every process holds whole (e.g. evaluation windows) as a global array
    sharded by ``sharding``: each process copies only its own rows."""
    n = len(jax.tree.leaves(batch)[0])
    return put_rows(sharding, lambda r: jax.tree.map(lambda a: np.asarray(a)[r], batch), n)


def sync(name: str) -> None:
    """A barrier across processes (no-op on one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)
