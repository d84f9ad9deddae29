"""train.py's own loop as a timing worker: the steady-state step a user gets, in turns.

``loop_worker`` (``benchmarks/vs_pytorch.py --worker dynjax_loop:VARIANT``) runs
``dynjax.train.loop.train`` — the function ``train.py`` calls — on the benchmark's model
(``benchmarks/common.py:bench_config``) in a temporary run directory: the real language-model
task (its batches cut from the embedded corpus for each step and placed by
``distributed.put_rows``), the non-finite guard, a line in metrics.jsonl and the TensorBoard
events every ``--loop-log-every`` steps, the progress bar (to a file), the checkpoint and
validation cadences past the run's end. Nothing of the loop is rewritten; one hook is added
around the guarded step the loop calls (this process's ``guard.guarded_step`` returns it).
Before a step, the hook may hand the turn to the orchestrator and wait for a command on
stdin, one line each, answered with one JSON line on stdout:

- ``VARIANT train``: ``--settle`` steps, a wait for the device, ``--loop-steps`` steps and a
  wait again: ``seconds`` is that interval per step (the loop's steady state: each step's
  batch, dispatch, bookkeeping and its log line where one falls, overlapped with the previous
  step's execution as in any run). ``host_gap_s``: median host time between steps outside
  the step call (batch, bookkeeping, progress bar; a log step's gap also waits for the
  device); ``dispatch_s``: median time the step call takes to return.
- ``VARIANT forward``: the forward train.py runs, its validation: ``evaluation.evaluate``
  with the loop's own evaluator step (route ``dense``, or ``topk`` for MoD: the computation
  the PyTorch model runs) over one batch of validation windows, after ``--settle`` untimed.
- ``VARIANT profile``: a ``jax.profiler`` trace of ``--profile-steps`` loop steps, summarised
  by ``cpu_limit.profile_trace``, and the cost of one ``task.batch`` call.
- end of input: the loop stops (no final checkpoint or evaluation) and the worker exits.
"""
from __future__ import annotations

import contextlib
import json
import statistics
import sys
import tempfile
import time

import jax

from benchmarks import cpu_limit
from benchmarks.common import bench_config
from dynjax.train import evaluation, guard, loop

WARMUP_STEPS = 2      # the first compiles; the second runs the compiled program once


class _Finished(Exception):
    """End of the orchestrator's input: leave the training loop."""


def loop_config(variant: str, args):
    """The benchmark model as a train.py config: cadences for a timing run."""
    config = bench_config(variant, args.batch_size, args.seq_len, attn_block=args.attn_block)
    tc = config.train
    per_round = args.settle + args.loop_steps
    tc.steps = WARMUP_STEPS + args.repeats * per_round + args.settle + args.profile_steps + 4
    tc.warmup_steps = min(tc.warmup_steps, tc.steps)
    tc.log_every = args.loop_log_every
    tc.eval_every = tc.ckpt_every = 10 * tc.steps     # never inside the run
    config.eval.windows = config.eval.batch_size = args.batch_size
    config.eval.decode_check_windows = 0
    return config


class Turns:
    """The hook: counts the loop's steps and hands turns to the orchestrator."""

    def __init__(self, variant, args, workdir):
        self.variant, self.args, self.workdir = variant, args, workdir
        self.calls, self.task, self.jitted = 0, None, None
        self.plan = []          # the coming phases: ("settle" | "time" | "trace", steps left)
        self.marks = []         # (enter, exit) perf_counter of each timed step call
        self.t0 = None          # the timed phase's start; None outside one

    # -- wiring into the loop ---------------------------------------------------------
    @contextlib.contextmanager
    def installed(self):
        """While open, the loop's guarded step is wrapped by this hook and its task kept."""
        real_guarded, real_task_of = guard.guarded_step, loop.task_of

        def guarded_step(step_fn, skip, options=None):
            self.jitted = real_guarded(step_fn, skip, options)

            def step(state, record, *batch):
                self.before(state, record, batch)
                enter = time.perf_counter()
                out = self.jitted(state, record, *batch)
                if self.t0 is not None:
                    self.marks.append((enter, time.perf_counter()))
                return out
            return step

        def task_of(config):
            cls = real_task_of(config)
            hook = self

            class Recorded(cls):
                def __init__(self, c):
                    super().__init__(c)
                    hook.task = self
            return Recorded

        guard.guarded_step, loop.task_of = guarded_step, task_of
        try:
            yield self
        finally:
            guard.guarded_step, loop.task_of = real_guarded, real_task_of

    # -- per step ---------------------------------------------------------------------
    def before(self, state, record, batch):
        """Runs before each of the loop's steps, with the state the step will take."""
        self.calls += 1
        if self.calls <= WARMUP_STEPS:
            return
        if self.calls == WARMUP_STEPS + 1:
            jax.block_until_ready(state)
            self.forward(state)                       # compiles the evaluation step
            say({"ready": True})
        while not self.plan or self.plan[0][1] == 0:  # a phase ended (or none began yet)
            if self.plan:
                self.end(self.plan.pop(0)[0], state)
            if not self.plan:
                self.serve(state, record, batch)      # the next command's phases
            self.start(self.plan[0][0], state)
        kind, left = self.plan[0]
        self.plan[0] = (kind, left - 1)

    def start(self, kind, state):
        if kind in ("time", "trace"):
            jax.block_until_ready(state)              # the settle steps have run
            if kind == "trace":
                jax.profiler.start_trace(self.trace_dir, create_perfetto_trace=True)
            self.t0, self.marks = time.perf_counter(), []

    def end(self, kind, state):
        if kind not in ("time", "trace"):
            return
        jax.block_until_ready(state)                  # the phase's last step has run
        n = self.args.loop_steps if kind == "time" else self.args.profile_steps
        seconds, self.t0 = (time.perf_counter() - self.t0) / n, None
        if kind == "trace":
            jax.profiler.stop_trace()
            say({"profile": self.summarise(seconds, self.marks)})
        else:
            say({"seconds": seconds, **host_times(self.marks)})

    def serve(self, state, record, batch):
        """Answer commands until one needs loop steps; set its phases."""
        for line in sys.stdin:
            name = line.split()[-1]
            if name == "forward":
                for _ in range(self.args.settle):
                    self.forward(state)
                t0 = time.perf_counter()
                self.forward(state)
                say({"seconds": time.perf_counter() - t0})
                continue
            if name == "profile":
                self.hlo = self.jitted.lower(state, record, *batch).compile().as_text()
                self.batch_s = batch_seconds(self.task, self.calls)
                self.trace_dir = tempfile.mkdtemp(dir=self.workdir, prefix="trace")
                self.plan = [("settle", self.args.settle), ("trace", self.args.profile_steps)]
            else:
                self.plan = [("settle", self.args.settle), ("time", self.args.loop_steps)]
            return
        raise _Finished

    def forward(self, state):
        task = self.task
        route = "dense" if "dense" in task.evaluator.steps else "topk"
        windows = task.windows("validation")[:self.args.batch_size]
        return evaluation.evaluate(task.evaluator.steps[route], state["params"], windows,
                                   self.args.batch_size, task.evaluator.put)

    def summarise(self, seconds, marks) -> dict:
        try:
            prof = cpu_limit.profile_trace(self.trace_dir, self.hlo, self.args.profile_steps)
        except Exception as e:  # noqa: BLE001 - a runtime without per-op events: say so
            prof = {"unavailable": f"{type(e).__name__}: {e}"[:300]}
        prof["loop_step_s"] = seconds
        prof["batch_s"] = self.batch_s
        prof.update(host_times(marks))
        if "device_busy_s" in prof:
            prof["not_executing_s"] = prof["span_s"] - prof["device_busy_s"]
            prof["step_breakdown_s"] = {
                **{c: share * prof["device_busy_s"] for c, share in prof["op_share"].items()},
                "data_host": prof["not_executing_s"]}
        prof["note"] = ("a traced run of the loop (tracing adds a little per op); loop_step_s: "
                        "the traced steps between two waits for the device, per step (with "
                        "the first step's dispatch, which a running loop overlaps); "
                        "step_breakdown_s adds up to span_s; batch_s: one task.batch call")
        return prof


def host_times(marks) -> dict:
    """Medians of the host's time between one step call's return and the next call (the
    batch, the loop's bookkeeping, a log line; at a log step also the wait for the device)
    and of the step call itself (jit dispatch; the step runs asynchronously)."""
    gaps = [b[0] - a[1] for a, b in zip(marks, marks[1:])]
    return {"host_gap_s": cpu_limit.median_or_none(gaps),
            "dispatch_s": cpu_limit.median_or_none([b - a for a, b in marks])}


def batch_seconds(task, step: int, calls: int = 5) -> float:
    """Median seconds of the loop's ``task.batch(step)`` (cut and placed on the device)."""
    times = []
    for i in range(calls):
        t0 = time.perf_counter()
        jax.block_until_ready(task.batch(step + i))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def say(obj) -> None:
    print(json.dumps(obj), flush=True)


def loop_worker(variant: str, args, config=None) -> None:
    """Run train.py's loop on the benchmark model (or ``config``), serving the
    orchestrator's turns until its input ends."""
    config = loop_config(variant, args) if config is None else config
    with tempfile.TemporaryDirectory(prefix="dynjax_user_path") as workdir, \
            Turns(variant, args, workdir).installed(), \
            open(f"{workdir}/progress.txt", "w") as progress, \
            contextlib.redirect_stderr(progress):   # the progress bar, as in a run, to a file
        try:
            loop.train(config, f"{workdir}/run", progress=True)
        except _Finished:
            return
    say({"failed": "the loop ended before the orchestrator's last command"})
