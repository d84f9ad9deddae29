"""Preemption: SIGTERM (what Slurm, Kubernetes and TPU maintenance send) and SIGINT (Ctrl-C)
stop a run at the next step boundary, after a checkpoint of that step, instead of killing it.

While :class:`StopOnSignal` is active the first signal only sets a flag (and says so on
stderr); the loop checks the flag after each step (a Python bool: no device sync), saves the
step and raises :class:`Preempted`, which ``train.py`` turns into one line saying how to
resume and exit status ``128 + signal number`` (143 for SIGTERM, 130 for SIGINT: what a
shell reports for a process the signal killed, so schedulers see the usual status). A
second signal exits at once (same status), without saving: the newest checkpoint on disk
is complete either way (orbax renames a step into place only once it is whole).

On many processes each one must receive the signal (Slurm and Kubernetes signal every
task); the handlers are installed only on the main thread.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_status(signum: int) -> int:
    return 128 + signum


class Preempted(Exception):
    """The run stopped on a signal after saving ``step``; re-running the command resumes."""

    def __init__(self, signum: int, step: int, run_dir):
        self.signum, self.step, self.run_dir = signum, step, run_dir
        super().__init__(f"stopped by {signal.Signals(signum).name} at step {step}: saved "
                         f"checkpoint {step} in {run_dir}/checkpoints; re-run the same command "
                         "to resume from it")


class StopOnSignal:
    """Context manager: ``.signum`` is the first signal received (None until then)."""

    def __init__(self, log=None):
        self.signum = None
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._old = {}

    def _handle(self, signum, frame):
        del frame
        name = signal.Signals(signum).name
        if self.signum is not None:
            self.log(f"train.py: {name} again: exiting at once without saving (the newest "
                     "checkpoint on disk is complete; re-run the same command to resume)")
            sys.stdout.flush()
            os._exit(exit_status(signum))
        self.signum = signum
        self.log(f"train.py: {name} received: saving a checkpoint at the end of this step, "
                 "then stopping (send it again to exit at once)")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()
        return False
