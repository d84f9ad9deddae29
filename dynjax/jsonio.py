"""JSON values and files written atomically (a reader sees the old file or the new one)."""
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


def write_text_atomic(path, text: str) -> None:
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_jsonl(path):
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]
