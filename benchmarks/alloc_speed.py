"""Which C allocator setting dynjax's entry points should use: step times and page faults.

    python -m benchmarks.alloc_speed --out results/alloc_speed.json [--rounds 2] [--steps 4]

The allocator is fixed when a process starts, so each setting of ``dynjax.runtime`` runs in
its own process (the dense benchmark model of ``benchmarks/common.py``, T=1024, batch 8,
f32): ``system`` (glibc defaults), ``hugetlb`` (transparent huge pages: the default),
``retain`` (huge pages, freed memory kept) and, where Debian's libjemalloc2 is installed,
``jemalloc`` (decay off). The processes run one after another, round by round, so load
falls on each alike; each reports the median time of its train step and of its forward
after one warm-up call of each, their minor page faults per call, and its peak resident size.
"""
from dynjax.runtime import describe, setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from dynjax import runtime  # noqa: E402
from dynjax.jsonio import command_line, publish_json  # noqa: E402

def child(args):
    """Time the train step in this process; print one JSON line."""
    import jax

    from benchmarks.common import bench_config, dynjax_timers
    tokens = jax.random.randint(jax.random.key(1), (args.batch_size, args.seq_len), 0, 256)
    timers = dynjax_timers(bench_config("dense", args.batch_size, args.seq_len), tokens)
    out = {}
    for name, call in (("step", timers["train"]), ("forward", timers["forward"])):
        jax.block_until_ready(call())
        times, r0 = [], resource.getrusage(resource.RUSAGE_SELF)
        for _ in range(args.steps):
            t0 = time.perf_counter()
            jax.block_until_ready(call())
            times.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        out.update({f"{name}_s": statistics.median(times),
                    f"minor_faults_per_{name}": (r1.ru_minflt - r0.ru_minflt) / args.steps,
                    f"sys_s_per_{name}": (r1.ru_stime - r0.ru_stime) / args.steps})
    out["max_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.child:
        return child(args)
    settings = [k for k in runtime.SETTINGS if k != "jemalloc" or os.path.exists(runtime.JEMALLOC)]
    runs = {name: [] for name in settings}
    load_before = os.getloadavg()
    for _ in range(args.rounds):
        for name in settings:
            env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}
            env = dict(runtime.environment(name, env), DYNJAX_MALLOC="system",
                       PYTHONPATH=os.getcwd())
            out = subprocess.run([sys.executable, "-m", "benchmarks.alloc_speed", "--child",
                                  "--steps", str(args.steps), "--seq-len", str(args.seq_len),
                                  "--batch-size", str(args.batch_size)], env=env, check=True,
                                 capture_output=True, text=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    res = {"command": command_line(), "runtime": describe(), "load_average_before": load_before,
           "load_average_after": os.getloadavg(),
           "settings": {name: runtime.SETTINGS[name] for name in settings},
           "note": "one process per setting and round; medians over rounds; compare ratios"}
    for name, rs in runs.items():
        res[name] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        res[name]["step_s_per_round"] = [r["step_s"] for r in rs]
        res[name]["forward_s_per_round"] = [r["forward_s"] for r in rs]
    res["default"] = runtime.DEFAULT
    for call in ("step", "forward"):
        res[f"{call}_time_over_system"] = {n: res[n][f"{call}_s"] / res["system"][f"{call}_s"]
                                           for n in runs}
    publish_json(res, args.out, indent=2)


if __name__ == "__main__":
    main()
