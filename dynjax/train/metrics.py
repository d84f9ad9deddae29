"""The run's metric log: one JSON object per line, written by process 0 only.

Appends are crash-safe: each record is one ``write`` of a whole line, flushed, so a kill or
a full disk can leave at most a torn last line. On resume that line is dropped with a
warning (it belongs to steps the run is about to redo), as are records written after the
checkpoint being resumed; a malformed line anywhere else is a :class:`CorruptFile` naming
the line, since it means the file was edited or damaged, not torn.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import time

import jax
from etils import epath

from dynjax.errors import CorruptFile
from dynjax.jsonio import is_local, to_python, write_text_atomic
from dynjax.train import preempt
from dynjax.train.tensorboard import EventWriter


def read_records(path, warn=None) -> list[dict]:
    """The records of a JSONL file (none if it is absent). A torn last line is dropped (and
    ``warn``\\ ed); a bad line before it raises :class:`CorruptFile`."""
    path = epath.Path(path)
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.split("\n")
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:           # no newline after it: an append cut short
                if warn:
                    warn(f"warning: dropped the torn last line of {path} ({len(line)} bytes "
                         "written by an append that was cut short)")
                break
            raise CorruptFile(f"{path} line {i + 1} is not JSON: the log was damaged or "
                              f"edited; delete line {i + 1} (or restore the file) and re-run"
                              ) from None
    return records


def append_line(path, record: dict) -> None:
    """Append ``record`` as one line with a single write (a crash leaves it whole or torn).
    An object store (``gs://``) cannot append: the object is written again with the line."""
    data = (json.dumps(to_python(record)) + "\n").encode()
    if not is_local(path):
        path = epath.Path(path)
        path.write_bytes((path.read_bytes() if path.exists() else b"") + data)
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError as e:   # os.write's error names no file (a full disk): name it
        raise OSError(e.errno, e.strerror, os.fspath(path)) from None
    finally:
        os.close(fd)


class JsonlWriter:
    """Appends one JSON object per line. On resume, records past ``resume_step`` (written
    after the checkpoint that is being resumed) are dropped so the log matches the run, and
    so are ``redo`` records at ``resume_step`` itself (the final evaluation, when the run
    stopped between its last checkpoint and eval.json)."""

    def __init__(self, path, resume_step: int | None = None, redo=lambda record: False):
        self.path = epath.Path(path)
        self.active = jax.process_index() == 0
        self.kept = [] if resume_step is not None else None   # the records the log keeps
        if self.active and resume_step is not None and self.path.exists():
            warn = preempt.say
            self.kept = [r for r in read_records(self.path, warn)
                         if r.get("step", 0) < resume_step
                         or (r.get("step", 0) == resume_step and not redo(r))]
            write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in self.kept))

    def write(self, record: dict) -> None:
        if self.active:
            append_line(self.path, record)


class RunLog:
    """A run's metric log: metrics.jsonl and the TensorBoard event files beside it
    (:mod:`dynjax.train.tensorboard`), the same records in both. ``flush`` at log points
    writes the events out; lines go to metrics.jsonl as they come."""

    def __init__(self, run_dir, resume_step: int | None = None, redo=lambda record: False,
                 name: str = "metrics.jsonl"):
        run_dir = epath.Path(run_dir)
        self.jsonl = JsonlWriter(run_dir / name, resume_step, redo)
        self.events = EventWriter(run_dir, keep=self.jsonl.kept)

    def write(self, record: dict) -> None:
        self.jsonl.write(record)
        self.events.write(record)

    def flush(self) -> None:
        self.events.flush()

    def close(self) -> None:
        self.events.close()


# --------------------------------------------------------------- the log interval

PARTIAL = "train_interval.json"   # a run's mid-interval loss sums, by checkpoint step


class Interval:
    """The steps since the last log record, for the record that closes it: the mean of their
    losses (each step's float32 loss read on the host and summed in step order in float64)
    and their training time, without this process's first step (it compiles), evaluations
    and checkpoint saves (:meth:`excluded`). A checkpoint saved mid-interval keeps the
    partial sum in ``train_interval.json``, so a run resumed there logs the same means as
    one that never stopped. Only reads the step's outputs: training is unchanged."""

    def __init__(self, run_dir, start: int, active: bool):
        self.path = epath.Path(run_dir) / PARTIAL
        self.active = active
        self.pending = []            # this interval's losses not read yet (device scalars)
        self.saved = self._read_saved(start)
        self.sum, self.n = self.saved.get(str(start), (0.0, 0))
        self.t0 = self.step0 = None  # the clock starts after this process's first step
        self.skipped = 0.0           # seconds excluded since t0

    def _read_saved(self, start: int) -> dict:
        try:
            saved = json.loads(self.path.read_text()) if self.path.exists() else {}
        except (OSError, ValueError):
            return {}                 # a damaged file: the first interval restarts
        return {k: v for k, v in saved.items() if int(k) <= start}

    def add(self, loss) -> None:
        self.pending.append(loss)

    def _read(self) -> None:
        for value in jax.device_get(self.pending):
            if math.isfinite(float(value)):     # a skipped non-finite step is not averaged
                self.sum += float(value)
                self.n += 1
        self.pending = []

    def start_clock(self, state, done: int) -> None:
        """After this process's first step: the time from here is training time."""
        jax.block_until_ready(state)
        self.t0, self.step0, self.skipped = time.perf_counter(), done, 0.0

    @contextlib.contextmanager
    def excluded(self):
        """Time spent inside is not training time (evaluation, checkpoint saves)."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.skipped += time.perf_counter() - t

    def close(self, done: int) -> tuple[float, int, float]:
        """(mean loss, timed steps, their seconds) of the interval ending at step ``done``;
        the next interval starts empty."""
        self._read()
        mean = self.sum / self.n if self.n else float("nan")   # all skipped: NaN
        now = time.perf_counter()
        steps = done - self.step0 if self.step0 is not None else 0
        seconds = now - self.t0 - self.skipped if self.t0 is not None else 0.0
        self.sum, self.n = 0.0, 0
        if self.t0 is not None:
            self.t0, self.step0, self.skipped = now, done, 0.0
        return mean, steps, seconds

    def keep_partial(self, step: int) -> None:
        """At a checkpoint of step ``step``: the interval's sum so far, for a resume there."""
        self._read()
        self.saved[str(step)] = (self.sum, self.n)
        if self.active:
            write_text_atomic(self.path, json.dumps(self.saved))
