"""A JSONL metric writer (process 0 only) and atomic JSON files."""
from __future__ import annotations

import json
import os
import pathlib

import jax
import numpy as np


def to_python(x):
    """Arrays and numpy scalars to plain JSON values."""
    if isinstance(x, dict):
        return {k: to_python(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_python(v) for v in x]
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        x = np.asarray(x)
        return x.item() if x.ndim == 0 else x.tolist()
    return x


def write_json_atomic(path, obj) -> None:
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(to_python(obj), indent=1, sort_keys=True))
    os.replace(tmp, path)


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


def write_text_atomic(path, text: str) -> None:
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_jsonl(path):
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]
