"""Preemption: SIGTERM (what Slurm, Kubernetes and TPU maintenance send) and SIGINT (Ctrl-C)
stop a run at the next step boundary, after a checkpoint of that step, instead of killing it.

While :class:`StopOnSignal` is active the first signal only sets a flag (and says so on
stderr); the loop reads the flag once per step (a Python bool: no device sync), saves that
step and raises :class:`Preempted`, which ``train.py`` turns into one line saying how to
resume and exit status ``128 + signal number`` (143 for SIGTERM, 130 for SIGINT: what a
shell reports for a process the signal killed, so schedulers see the usual status). A
second signal exits at once (same status), without saving: the newest checkpoint on disk
is complete either way (orbax renames a step into place only once it is whole).

"At once" holds while the main thread is inside a long device computation, a compilation
or a checkpoint write: Python runs a signal handler only when the main thread next runs
Python code, so the signals are also read by a watcher thread from the interpreter's
wakeup file descriptor (:func:`signal.set_wakeup_fd`, written by the C-level handler the
moment a signal arrives). The watcher prints the lines and makes the second signal's exit;
the Python-level handler only sets the flag the loop reads.

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
        self._old_wakeup = None
        self._write_fd = None

    def _handle(self, signum, frame):   # the main thread, when it next runs Python code
        del frame
        if self.signum is None:
            self.signum = signum

    def _watch(self, read_fd: int) -> None:   # the watcher thread: the moment a signal arrives
        seen = 0
        try:
            while data := os.read(read_fd, 64):   # b"": the context was left
                for signum in data:
                    if signum not in SIGNALS:
                        continue
                    seen += 1
                    name = signal.Signals(signum).name
                    if seen == 1:
                        self.log(f"train.py: {name} received: saving a checkpoint at the end "
                                 "of this step, then stopping (send it again to exit at once)")
                        continue
                    self.log(f"train.py: {name} again: exiting at once without saving (the "
                             "newest checkpoint on disk is complete; re-run the same command "
                             "to resume)")
                    sys.stdout.flush()
                    os._exit(exit_status(signum))
        finally:
            os.close(read_fd)

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)   # the C handler must never block on it
        self._old_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(read_fd,), name="dynjax-signals",
                         daemon=True).start()
        for s in SIGNALS:
            self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()
        if self._write_fd is not None:
            signal.set_wakeup_fd(self._old_wakeup)
            os.close(self._write_fd)   # the watcher reads what is left, then EOF, and ends
            self._write_fd = None
        return False
