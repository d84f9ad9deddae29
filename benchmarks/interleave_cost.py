"""What a pause between calls costs XLA:CPU's train step: back to back vs after a pause.

    python -m benchmarks.interleave_cost [--repeats 3] [--out results/interleave_cost.json]

XLA:CPU frees its temporaries after every call (about 3.3 GB for the dense benchmark model's
train step: d=256, T=1024, batch 8). On a virtual machine with free-page reporting (the
kernel's ``page_reporting`` module, e.g. Firecracker's balloon device) memory that stays free
for a few seconds goes back to the host, and the next call faults it in again slowly. This
times the same compiled step, in one process, three ways per round:

- ``back_to_back``: right after another call of the step (a training loop);
- ``after_pause``: after ``--pause`` seconds of sleep;
- ``after_torch_step``: right after one PyTorch train step of the same model (what an
  in-process, call-by-call comparison with PyTorch does; only where torch is installed).

Each reports the median wall time and the process's system (kernel) time during the call.
The JSON names the kernel's page-reporting setting when its command line has one.
"""
import argparse
import os
import resource
import statistics
import time

from dynjax import runtime
from dynjax.runtime import describe  # noqa: E402

runtime.setup(__name__)

import jax  # noqa: E402

from benchmarks.common import VOCAB, bench_config, dynjax_timers  # noqa: E402
from dynjax.jsonio import command_line, publish_json  # noqa: E402


def cpu_ticks() -> dict:
    """The whole machine's user, system and steal time in clock ticks (/proc/stat)."""
    with open("/proc/stat") as stat:
        f = stat.readline().split()
    return {"user": int(f[1]), "system": int(f[3]), "steal": int(f[8])}


def timed(fn):
    """(wall seconds, process system seconds, machine ticks) of one call of fn."""
    r0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF), cpu_ticks(), time.perf_counter()
    jax.block_until_ready(fn())
    wall, r1, c1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF), cpu_ticks()
    return wall, r1.ru_stime - r0.ru_stime, {k: c1[k] - c0[k] for k in c0}


def page_reporting() -> str | None:
    """The kernel command line's page_reporting settings, if any (Linux)."""
    try:
        with open("/proc/cmdline") as cmdline:
            words = cmdline.read().split()
    except OSError:
        return None
    found = [w for w in words if w.startswith("page_reporting")]
    return " ".join(found) or None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pause", type=float, default=2.0)
    ap.add_argument("--out")
    args = ap.parse_args()
    tokens = jax.random.randint(jax.random.key(1), (8, 1024), 0, VOCAB)
    step = dynjax_timers(bench_config("dense", 8, 1024), tokens)["train"]
    before = {"back_to_back": step, "after_pause": lambda: time.sleep(args.pause)}
    notes = {}
    try:
        import torch

        from benchmarks.vs_pytorch import torch_timers
        ttokens = torch.from_numpy(jax.device_get(tokens).astype("int64"))
        before["after_torch_step"] = torch_timers("dense", args, ttokens, False)["train"]
    except ImportError:
        notes["after_torch_step"] = "skipped: PyTorch is not installed (pip install -e '.[bench]')"
    for fn in (step, *before.values()):
        fn()  # compile / warm up
    jax.block_until_ready(step())
    load_before = os.getloadavg()
    runs = {name: [] for name in before}
    for _ in range(args.repeats):
        for name, first in before.items():
            first()
            runs[name].append(timed(step))
    res = {"command": command_line(), "runtime": describe(),
           "page_reporting": page_reporting(), "pause_s": args.pause, "repeats": args.repeats,
           "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
           "load_average_before": load_before, "load_average_after": os.getloadavg(),
           "notes": notes, "model": "benchmarks/common.py dense, T=1024, batch 8, f32"}
    for name, rs in runs.items():
        res[name] = {"step_s": statistics.median(r[0] for r in rs),
                     "system_s": statistics.median(r[1] for r in rs),
                     "step_s_per_round": [r[0] for r in rs],
                     "machine_ticks_per_round": [r[2] for r in rs]}
    res["step_over_back_to_back"] = {name: res[name]["step_s"] / res["back_to_back"]["step_s"]
                                     for name in runs}
    publish_json(res, args.out, indent=1)


if __name__ == "__main__":
    main()
