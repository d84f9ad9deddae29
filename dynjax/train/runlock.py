"""One writer per run directory: a lock on ``RUN/.lock`` held while training.

A second ``train.py`` on a live workdir stops with one line naming the holder. Locally the
lock is ``flock(2)`` (released however its holder dies); on an object store (``gs://``) it
is a lease renewed by a heartbeat thread and taken over once stale. What each form
guarantees and what it does not: docs/reliability.md (One writer per run directory).
"""
from __future__ import annotations

import fcntl
import json
import os
import pathlib
import socket
import threading
import time
import uuid

from etils import epath

from dynjax.errors import RunLocked

LOCK = ".lock"
LEASE_SECONDS = 120.0


def is_local(run_dir) -> bool:
    return "://" not in str(run_dir)


def RunLock(run_dir, lease: float = LEASE_SECONDS):
    """``with RunLock(run_dir):`` the caller is the run directory's only writer."""
    return FileLock(run_dir) if is_local(run_dir) else LeaseLock(run_dir, lease)


def _locked(where, holder: str, then: str = "") -> RunLocked:
    return RunLocked(f"{where} is being trained by another process ({holder}); wait for it "
                     f"to finish, or stop it, then re-run (it resumes from the newest "
                     f"checkpoint){then}")


def _holder() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}"


class FileLock:
    """``flock(2)`` on a local ``RUN/.lock``."""

    def __init__(self, run_dir):
        self.path = pathlib.Path(run_dir) / LOCK
        self.fd = None

    def __enter__(self):
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown pid"
            os.close(fd)
            raise _locked(self.path.parent, holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{_holder()}\n".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)   # closing releases the lock; the file stays, naming no one live
            self.fd = None
        return False


class LeaseLock:
    """A heartbeat lease in ``RUN/.lock`` on a path without flock (``gs://``)."""

    def __init__(self, run_dir, lease: float = LEASE_SECONDS):
        self.path = epath.Path(run_dir) / LOCK
        self.lease = lease
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._beat = None

    def _read(self) -> dict | None:
        try:
            record = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def _write(self):
        self.path.write_text(json.dumps({"holder": _holder(), "token": self.token,
                                         "heartbeat": time.time()}))

    def _refuse_if_live(self, record):
        if record is None or record.get("token") == self.token:
            return
        age = time.time() - float(record.get("heartbeat", 0))
        if age < self.lease:
            raise _locked(self.path.parent, record.get("holder", "unknown holder"),
                          f"; if that process is dead, its lease ends {self.lease - age:.0f} s "
                          "from now")

    def __enter__(self):
        self._refuse_if_live(self._read())
        self._write()
        time.sleep(min(1.0, self.lease / 100))   # a writer that claimed at the same moment
        self._refuse_if_live(self._read())       # has overwritten the lock by now
        self._beat = threading.Thread(target=self._heartbeat, daemon=True, name="run-lease")
        self._beat.start()
        return self

    def _heartbeat(self):
        while not self._stop.wait(self.lease / 4):
            record = self._read()
            if record is not None and record.get("token") != self.token:
                return                          # taken over after a stall: stop claiming
            self._write()

    def __exit__(self, *exc):
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        record = self._read()
        if record is not None and record.get("token") == self.token:
            self.path.unlink(missing_ok=True)
        return False
