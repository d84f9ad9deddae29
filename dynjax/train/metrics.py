"""The run's metric log: one JSON object per line, written by process 0 only."""
from __future__ import annotations

import json
import pathlib

import jax

from dynjax.jsonio import to_python, write_text_atomic


class JsonlWriter:
    """Appends one JSON object per line. On resume, records past ``resume_step`` (written
    after the checkpoint that is being resumed) are dropped so the log matches the run."""

    def __init__(self, path, resume_step: int | None = None):
        self.path = pathlib.Path(path)
        self.active = jax.process_index() == 0
        if self.active and resume_step is not None and self.path.exists():
            keep = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            write_text_atomic(self.path, "".join(line + "\n" for line in keep))

    def write(self, record: dict) -> None:
        if self.active:
            with self.path.open("a") as f:
                f.write(json.dumps(to_python(record)) + "\n")
