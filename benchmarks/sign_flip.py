"""The audit's Monte Carlo sign-flip test: dynjax's chunked draw against
``scipy.stats.permutation_test`` (what it replaced), time and peak memory, in one run.

    python benchmarks/sign_flip.py [--windows 512] [--resamples 99999]

Both draw ``--resamples`` random sign flips of ``--windows`` per-window ΔNLL values (a
single-checkpoint audit's unit) and return a two-sided p; the p-values agree within Monte
Carlo error. Peak memory from ``tracemalloc`` (NumPy allocations), time from
``time.perf_counter``; JSON out.
"""
from dynjax.runtime import describe, setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse
import time
import tracemalloc

import numpy as np
import scipy.stats

from dynjax.audit import stats  # noqa: E402
from dynjax.jsonio import command_line, publish_json  # noqa: E402


def scipy_sign_flip(x, n_resamples, seed):
    return scipy.stats.permutation_test(
        (x,), lambda a, axis=-1: np.mean(a, axis=axis), permutation_type="samples",
        vectorized=True, alternative="two-sided", n_resamples=n_resamples,
        rng=np.random.default_rng(seed)).pvalue


def profile(fn):
    tracemalloc.start()
    t0 = time.perf_counter()
    p = fn()
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"p": float(p), "seconds": seconds, "peak_mb": peak / 1e6}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--windows", type=int, default=512)
    ap.add_argument("--resamples", type=int, default=99999)
    ap.add_argument("--effect", type=float, default=0.05, help="mean of the values (sd 1)")
    ap.add_argument("--out")
    args = ap.parse_args()
    x = np.random.default_rng(0).normal(args.effect, 1.0, args.windows)
    res = {"command": command_line(), "runtime": describe(), "args": vars(args),
           "dynjax": profile(lambda: stats.sign_flip_test(x, max_exact=0,
                                                          n_resamples=args.resamples)["p"]),
           "scipy": profile(lambda: scipy_sign_flip(x, args.resamples, 0))}
    res["ratio_dynjax_over_scipy"] = {k: res["dynjax"][k] / res["scipy"][k]
                                      for k in ("seconds", "peak_mb")}
    publish_json(res, args.out, indent=1)


if __name__ == "__main__":
    main()
