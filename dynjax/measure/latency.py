"""Wall-clock latency of any model's forward, prefill and decode step, for benchmarks and
scorecards.

Every timer is a zero-argument function that runs one compiled call; ``paired_times``
warms each up (compiling it), then calls them in turns, one of each per round, and
reports medians. Turns matter on a shared machine: load from other processes falls on
every variant alike, so ratios of medians from one run are meaningful where absolute
times are not. Each call ends in ``jax.block_until_ready``, so asynchronous dispatch does
not hide device time.
"""
from __future__ import annotations

import os
import statistics
import time

import jax
import jax.numpy as jnp

from dynjax import decoding
from dynjax.measure.lm_execution import cost_of


def paired_times(timers: dict, repeats: int, settle: int = 0) -> dict:
    """Seconds of each zero-argument function in ``timers`` (name -> fn), measured in
    ``repeats`` interleaved rounds after one warm-up call each: name -> {"median_s",
    "min_s", "repeats", "times_s"} (``times_s``: each round's seconds, in order). The minimum
    is the better estimate of a call's own cost where other processes add delays (a shared
    CPU); the median is what a user waits, typically. ``settle`` untimed calls precede each
    timed one: a memory-heavy program right after another one's turn can run 2-3x slower on
    a VM, which calls in a row (a training loop, an audit) do not pay."""
    for fn in timers.values():
        jax.block_until_ready(fn())  # warm-up (compiles)
    times = {name: [] for name in timers}
    for _ in range(repeats):
        for name, fn in timers.items():
            for _ in range(settle):
                jax.block_until_ready(fn())
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - t0)
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "repeats": len(t),
                   "times_s": t} for name, t in times.items()}


def round_ratios(times: dict, name: str, baseline: str) -> list:
    """``name``'s seconds over ``baseline``'s in each round of one ``paired_times`` run: the
    two took turns, so a round's ratio shares that moment's load; their spread says how far
    a median ratio is from 1 by chance."""
    return [a / b for a, b in zip(times[name]["times_s"], times[baseline]["times_s"])]


def paired_medians(timers: dict, repeats: int) -> dict:
    """Median seconds of each function in ``timers``, measured as ``paired_times`` does."""
    return {name: t["median_s"] for name, t in paired_times(timers, repeats).items()}


def forward_timer(model, params, tokens):
    """One full-sequence forward (the model's own ``apply``: no cache is written)."""
    fn = jax.jit(lambda p, t: model.apply(p, t)[0])
    return lambda: fn(params, tokens)


def prefill_timer(cfg, params, tokens, max_len: int | None = None):
    """``decoding.prefill`` of ``tokens`` (B, P) into a cache for max_len (default P)."""
    fn = jax.jit(lambda p, t: decoding.prefill(cfg, p, t, max_len)[:2])
    return lambda: fn(params, tokens)


def decode_timer(cfg, params, batch: int, max_len: int, pos: int | None = None,
                 branch: str = "cond"):
    """One ``decoding.decode_step`` of ``batch`` tokens at position ``pos`` (default the
    last, max_len - 1) against a max_len cache. The cache is donated and carried from call
    to call as in generation; its shapes, hence the step's cost, are fixed."""
    step = jax.jit(lambda p, c, tok, t: decoding.decode_step(cfg, p, c, tok, t, branch)[:2],
                   donate_argnums=1)
    tok = jnp.zeros((batch,), jnp.int32)
    t = jnp.full((batch,), max_len - 1 if pos is None else pos)
    carry = {"cache": decoding.init_cache(cfg, batch, max_len)}

    def one():
        logits, carry["cache"] = step(params, carry["cache"], tok, t)
        return logits
    return one


def compiled_forward_timers(programs: dict, inputs, batches) -> tuple[dict, dict]:
    """Timers ``{name}/forward_b{b}`` of each forward (name -> (fn(params, x), params)) on
    the first b rows of ``inputs``, and XLA's flops of each on one row. The one-row program
    is compiled once, then counted and timed: a count and a timer jitted apart compile it
    twice."""
    one = jnp.asarray(inputs[:1])
    timers, flops = {}, {}
    for name, (fn, p) in programs.items():
        jitted = jax.jit(fn)
        single = jitted.lower(p, one).compile()
        flops[name] = cost_of(single)["flops"]
        for b in batches:
            run, x = (single, one) if b == 1 else (jitted, jnp.asarray(inputs[:b]))
            timers[f"{name}/forward_b{b}"] = lambda run=run, p=p, x=x: run(p, x)
    return timers, flops


def load_average() -> list:
    """The machine's 1, 5 and 15 minute load averages, to record beside timings."""
    return [round(x, 2) for x in os.getloadavg()]


KINDS = ("forward", "prefill", "decode")


def model_timers(cfg, params, seq_len: int, batches=(8, 1), key=None) -> dict:
    """Timers of one model (any family, any params, e.g. a checkpoint's): for each batch b,
    ``forward_b{b}`` (the model's apply over b x seq_len), ``prefill_b{b}`` (the same tokens
    into a seq_len cache) and ``decode_b{b}`` (one token per sequence at the last position
    of a seq_len cache). Pass them, with other models', to ``paired_medians``."""
    key = jax.random.key(1) if key is None else key   # not at import: JAX starts later (many hosts)
    from dynjax.models import build
    model = build(cfg)
    out = {}
    for b in batches:
        tokens = jax.random.randint(key, (b, seq_len), 0, cfg.vocab_size)
        out[f"forward_b{b}"] = forward_timer(model, params, tokens)
        out[f"prefill_b{b}"] = prefill_timer(cfg, params, tokens)
        out[f"decode_b{b}"] = decode_timer(cfg, params, b, seq_len)
    return out


def rates(medians: dict, seq_len: int) -> dict:
    """Tokens per second from ``model_timers``' medians: b * seq_len per forward or prefill,
    b per decode step."""
    out = {}
    for name, s in medians.items():
        kind, b = name.rsplit("_b", 1)
        out[name] = int(b) * (1 if kind == "decode" else seq_len) / s
    return out
