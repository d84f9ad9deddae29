"""Preemption: SIGTERM, SIGINT, SIGHUP and SIGUSR1 stop a run at the next step boundary,
after a checkpoint of that step, instead of killing it; a second signal exits at once.

:class:`StopOnSignal` sets a flag the loop reads once per step (no device sync); a watcher
thread on the wakeup fd makes "at once" hold inside long device work. ``train.py`` installs
the handlers before it imports JAX (:func:`from_the_start`). Exit statuses, the final
evaluation and many processes: docs/reliability.md (Signals).
"""
from __future__ import annotations

import os
import signal
import sys
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
# what the first signal does in each phase: TRAIN and FINAL let the loop stop (after a save;
# after the final evaluation), any other phase exits at once (nothing to save)
IDLE, TRAIN, FINAL = "idle", "train", "final"
_installed = None   # the StopOnSignal from_the_start() installed, if any


def say(line: str) -> None:
    """``line`` on stderr in one write: a line from the signal watcher thread never lands
    inside a log line the loop is printing (print writes the text and the newline apart)."""
    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()


def exit_status(signum: int) -> int:
    return 128 + signum


class Preempted(Exception):
    """The run stopped on a signal after saving ``step``; re-running the command resumes."""

    def __init__(self, signum: int, step: int, run_dir, finished: bool = False):
        self.signum, self.step, self.run_dir = signum, step, run_dir
        name = signal.Signals(signum).name
        super().__init__(
            f"stopped by {name} after the final evaluation of step {step}: the run is "
            f"finished ({run_dir}/eval.json written)" if finished else
            f"stopped by {name} at step {step}: saved checkpoint {step} in {run_dir}/"
            "checkpoints; re-run the same command to resume from it")


class StopOnSignal:
    """Context manager: ``.signum`` is the first signal received (None until then)."""

    def __init__(self, log=None, phase: str = TRAIN):
        self.signum, self.phase, self.outer = None, phase, None
        self.log = log or say
        self._old = {}
        self._old_wakeup = None
        self._write_fd = None
        self._watcher = None

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
                    if seen == 1 and self.phase == TRAIN:
                        self.log(f"train.py: {name} received: saving a checkpoint at the end "
                                 "of this step, then stopping (send it again to exit at once)")
                        continue
                    if seen == 1 and self.phase == FINAL:
                        self.log(f"train.py: {name} received during the final evaluation: "
                                 "finishing it (the last step is saved), then stopping (send "
                                 "it again to exit at once)")
                        continue
                    if seen == 1:
                        self.log(f"train.py: {name} received: exiting (not training: nothing "
                                 "to save)")
                        sys.stdout.flush()
                        os._exit(exit_status(signum))
                    self.log(f"train.py: {name} again: exiting at once without saving (the "
                             "newest checkpoint on disk is complete; re-run the same command "
                             "to resume)")
                    sys.stdout.flush()
                    os._exit(exit_status(signum))
        finally:
            os.close(read_fd)

    def __enter__(self):
        if _installed is not None and _installed is not self:   # train.py's, from its start
            self.outer = _installed
            _installed.signum, _installed.phase = None, self.phase
            return _installed
        if threading.current_thread() is not threading.main_thread():
            return self
        read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)   # the C handler must never block on it
        self._old_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._watcher = threading.Thread(target=self._watch, args=(read_fd,),
                                         name="dynjax-signals", daemon=True)
        self._watcher.start()
        for s in SIGNALS:
            self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        if self.outer is not None:
            self.outer.phase, self.outer = IDLE, None
            return False
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()
        if self._write_fd is not None:
            signal.set_wakeup_fd(self._old_wakeup)
            os.close(self._write_fd)   # the watcher reads what is left, then EOF, and ends
            self._write_fd = None
            self._watcher.join(timeout=10)   # every signal received is reported before we go on
        return False


def from_the_start() -> StopOnSignal:
    """Install the handlers for the whole program (``train.py`` calls it first thing): until
    the loop arms them, the first signal exits at once; the loop's :class:`StopOnSignal`
    then uses these. Idempotent."""
    global _installed
    if _installed is None:
        _installed = StopOnSignal(phase=IDLE).__enter__()
    return _installed
