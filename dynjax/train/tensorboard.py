"""TensorBoard event files beside metrics.jsonl, written with tensorboardX (no TensorFlow).

Every numeric field of a metrics.jsonl record becomes one scalar tagged ``{split}/{field}``
(list and dict fields add their index or key). Process 0 alone writes, buffered and flushed
at the loop's log points; on resume the event files are rewritten to hold exactly the
records metrics.jsonl keeps, so TensorBoard never sees a step twice. Tags, buffering and
``gs://``: docs/training.md (TensorBoard event files).
"""
from __future__ import annotations

import collections
import io
import os
import struct
import time
import uuid

import jax
from etils import epath
from tensorboardX import event_file_writer, record_writer
from tensorboardX.proto import event_pb2
from tensorboardX.summary import scalar

from dynjax.jsonio import is_local, to_python

PREFIX = "events.out.tfevents."
ROTATE_BYTES = 4 << 20   # object stores: start a new file past this, so uploads stay small


def scalars(record: dict) -> list[tuple[str, float]]:
    """(tag, value) of every numeric field of a metrics record (flags such as ``causal``
    are not series: booleans are left out; nor are ``windows``, how many windows an
    evaluation scored, a fixed count)."""
    split = record.get("split", "train")
    out = []

    def walk(tag, v):
        if isinstance(v, dict):
            for k, x in v.items():
                if k != "windows":
                    walk(f"{tag}/{k}", x)
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                walk(f"{tag}/{i}", x)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append((tag, float(v)))

    for key, value in to_python(record).items():
        if key not in ("step", "split", "windows"):
            walk(f"{split}/{key}", value)
    return out


def event_files(logdir) -> list[epath.Path]:
    d = epath.Path(logdir)
    return sorted(d.glob(PREFIX + "*")) if d.exists() else []


def read_events(path) -> list:
    """The Event protos of one event file, each record's two CRCs checked; a torn tail (a
    write cut short) ends the list."""
    data, pos, events = epath.Path(path).read_bytes(), 0, []
    crc = lambda b: struct.pack("I", record_writer.masked_crc32c(b))  # noqa: E731
    while pos + 12 <= len(data):
        header = data[pos:pos + 8]
        (n,) = struct.unpack("Q", header)
        end = pos + 12 + n + 4
        if data[pos + 8:pos + 12] != crc(header) or end > len(data):
            break
        body = data[pos + 12:end - 4]
        if data[end - 4:end] != crc(body):
            break
        event = event_pb2.Event()
        event.ParseFromString(body)
        events.append(event)
        pos = end
    return events


def read_scalars(logdir) -> list[tuple[str, int, float]]:
    """(tag, step, value) of every scalar event in ``logdir``'s event files."""
    return [(v.tag, int(ev.step), float(v.simple_value))
            for f in event_files(logdir) for ev in read_events(f)
            if ev.HasField("summary") for v in ev.summary.value]


class _WholeObject:
    """An event file on an object store: written whole at every flush."""

    def __init__(self, path):
        self.path, self.buf = epath.Path(path), io.BytesIO()

    def write(self, data):
        self.buf.write(data)

    def flush(self):
        self.path.write_bytes(self.buf.getvalue())

    def close(self):
        self.flush()


class _EpathFactory:
    def open(self, path):
        return _WholeObject(path)

    def directory_check(self, path):
        pass


# tensorboardX's own gs:// writer needs google-cloud-storage; epath's backend is orbax's
record_writer.register_writer_factory("gs", _EpathFactory())


class EventWriter:
    """One run directory's event files. ``keep``: the records metrics.jsonl holds (None
    leaves existing event files as they are)."""

    def __init__(self, logdir, keep: list | None = None):
        self.dir = epath.Path(logdir)
        self.active = jax.process_index() == 0
        self._writer = None
        if not self.active:
            return
        old = event_files(self.dir) if keep is not None else []
        old_events = [ev for f in old for ev in read_events(f)]   # read before any write
        self._open()
        if old or keep:
            self._rewrite(old_events, keep)
            self.flush()
            for f in old:
                f.unlink()

    def _open(self):
        if self._writer is not None:
            self._writer.close()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._bytes = 0
        self._writer = event_file_writer.EventsWriter(
            os.fspath(self.dir / "events"), f".{uuid.uuid4().hex[:8]}.dynjax")

    def _event(self, event) -> None:
        self._writer.write_event(event)
        self._bytes += event.ByteSize() + 16

    def _rewrite(self, old_events, keep: list) -> None:
        """The old events metrics.jsonl still holds (their wall times kept), then those it
        holds that no event file did."""
        want = collections.Counter((tag, int(r.get("step", 0))) for r in keep
                                   for tag, _ in scalars(r))
        for ev in old_events:
            if not ev.HasField("summary"):
                continue
            for v in ev.summary.value:
                if want[(v.tag, ev.step)] > 0:
                    want[(v.tag, ev.step)] -= 1
                    out = event_pb2.Event(wall_time=ev.wall_time, step=ev.step)
                    out.summary.value.add().CopyFrom(v)
                    self._event(out)
        now = time.time()
        for r in keep:
            step = int(r.get("step", 0))
            for tag, value in scalars(r):
                if want[(tag, step)] > 0:
                    want[(tag, step)] -= 1
                    self._event(event_pb2.Event(wall_time=now, step=step,
                                                summary=scalar(tag, value)))

    def write(self, record: dict) -> None:
        """Buffer ``record``'s scalars (written at the next :meth:`flush`)."""
        if not self.active:
            return
        step, now = int(record.get("step", 0)), time.time()
        for tag, value in scalars(record):
            self._event(event_pb2.Event(wall_time=now, step=step, summary=scalar(tag, value)))

    def flush(self) -> None:
        if self._writer is None:
            return
        try:
            self._writer.flush()
        except OSError as e:   # a full disk: named by the event file, not "(unnamed path)"
            raise OSError(e.errno, e.strerror, e.filename or os.fspath(
                self.dir / "events.out.tfevents.*")) from None
        if not is_local(self.dir) and self._bytes > ROTATE_BYTES:
            self._open()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
