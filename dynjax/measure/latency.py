"""Wall-clock latency of compiled calls, measured so that ratios survive a noisy machine.

Variants take turns within each repeat (A B C, A B C, ...), so load that comes and goes hits
all of them alike; each call is blocked on before the clock stops; the first call (compile)
and one warm-up call are not timed; the median over repeats is reported.
"""
from __future__ import annotations

import statistics
import time

import jax


def interleaved(fns: dict, repeats: int = 5, warmup: int = 1) -> dict:
    """name -> median seconds of ``fn()`` over ``repeats`` interleaved rounds."""
    for fn in fns.values():
        for _ in range(1 + warmup):
            jax.block_until_ready(fn())
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}
