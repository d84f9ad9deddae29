"""One writer per run directory: an exclusive lock on ``RUN/.lock`` held while training.

Two ``train.py`` on one workdir would double every record and race on the checkpoints, so
the second one stops with one line naming the holder's pid. The lock is ``flock(2)``: the
kernel releases it when its holder dies however it dies (``kill -9`` included), so a lock
file left by a dead process is simply taken over. The file's text (pid, host) is only
there to name the holder. flock is per host: on a network filesystem shared by several
hosts it may not exclude a writer on another host.
"""
from __future__ import annotations

import fcntl
import os
import pathlib
import socket

from dynjax.errors import RunLocked

LOCK = ".lock"


class RunLock:
    """``with RunLock(run_dir):`` the caller is the run directory's only writer."""

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
            raise RunLocked(f"{self.path.parent} is being trained by another process "
                            f"({holder}); wait for it to finish, or stop it, then re-run "
                            "(it resumes from the newest checkpoint)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)   # closing releases the lock; the file stays, naming no one live
            self.fd = None
        return False
