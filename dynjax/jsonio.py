"""Atomic file writes and JSON conversion: the one helper data, train, audit, scripts and
benchmarks write their files with.

A file is written beside its path and ``os.replace``d (an object store's object is
written whole), so a reader sees the old file or the new one, never half; a program checks
its output folder first (:func:`check_writable`) and reads its JSON back with
:func:`read_json`, which names a corrupt file and its fix. Numpy only, no JAX import.
"""
from __future__ import annotations

import errno
import json
import os
import pathlib
import re
import shlex
import sys
import tempfile
import uuid
from typing import Callable

from etils import epath

from dynjax.errors import CorruptFile


def to_python(x):
    """Arrays (numpy or JAX) and numpy scalars to plain JSON values, recursively."""
    if isinstance(x, dict):
        return {k: to_python(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_python(v) for v in x]
    if hasattr(x, "__array__") and hasattr(x, "dtype"):
        import numpy as np

        x = np.asarray(x)
        return x.item() if x.ndim == 0 else x.tolist()
    return x


def is_local(path) -> bool:
    """A path of this machine's filesystem (not a ``scheme://`` URI such as ``gs://``)."""
    return "://" not in os.fspath(path)


def as_path(path):
    """``path`` as an ``etils.epath.Path`` (a local path stays a local one)."""
    return epath.Path(path)


def atomic_write(path, write: Callable) -> None:
    """``write(binary file object)`` into a temp file beside ``path``, then replace ``path``
    with it (mode 0644: results are for everyone to read); the temp file goes on failure.
    A URI is written straight to its object."""
    if not is_local(path):
        with epath.Path(path).open("wb") as f:
            write(f)
        return
    path = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)
            write(f)
        os.replace(tmp, path)
    except OSError as e:   # named by the file meant, not the temp file
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(path)) from None
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


def write_json_atomic(path, obj, **dumps) -> None:
    """``obj`` (arrays converted) as JSON; ``dumps`` overrides json.dumps' indent=1,
    sort_keys=True."""
    dumps = {"indent": 1, "sort_keys": True, **dumps}
    write_text_atomic(path, json.dumps(to_python(obj), **dumps))


# An absolute local path inside a string: starts at a "/" that follows no word character,
# ":", "/" or "." (so "runs/x", "./x" and "https://host/x" are left alone).
_ABS_PATH = re.compile(r"(?<![\w:/.~-])/[^\s,;:'\"`()<>|=]+")


_HF_SNAPSHOT = re.compile(r"models--(.+?)--([^/]+)/snapshots/([^/]+)/?$")


def portable_path(path) -> str:
    """How a results file names a path: relative to the working directory when inside it
    (``runs/fca/feature_gate_s0``), a Hugging Face cache snapshot by its repo id and commit
    (``ORG/NAME@COMMIT``, what ``dynjax.loaders.hub`` resolves), else by its name alone (a
    run is known by its folder's name), never as this machine's absolute path. URIs
    (``gs://...``) and relative paths stay as they are."""
    text = os.fspath(path)
    if not is_local(text) or not os.path.isabs(text):
        return text
    hub = _HF_SNAPSHOT.search(text)
    if hub:
        return f"{hub[1]}/{hub[2]}@{hub[3]}"
    rel = os.path.relpath(text)
    return rel if rel != ".." and not rel.startswith(".." + os.sep) else \
        (os.path.basename(os.path.normpath(text)) or text)


def portable(obj):
    """``obj`` (a JSON-like tree) with every absolute local path inside a string (or a key)
    made :func:`portable_path`: what a results JSON or report may hold."""
    if isinstance(obj, dict):
        return {portable(k): portable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [portable(v) for v in obj]
    if isinstance(obj, str) and "/" in obj:
        return _ABS_PATH.sub(lambda m: portable_path(m.group(0)), obj)
    return obj


def versions() -> dict:
    """What made a results file: dynjax's version, the commit (``git describe --always
    --dirty`` when dynjax runs from a git checkout, else "unknown") and jax's version (read
    from its metadata: this module does not import JAX)."""
    import subprocess
    from importlib import metadata

    from dynjax import __version__
    root = pathlib.Path(__file__).resolve().parents[1]
    commit = "unknown"
    if (root / ".git").exists():
        try:
            commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=root,
                                    capture_output=True, text=True, timeout=10,
                                    check=True).stdout.strip() or "unknown"
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        jax_version = metadata.version("jax")
    except metadata.PackageNotFoundError:
        jax_version = "unknown"
    return {"dynjax": __version__, "commit": commit, "jax": jax_version}


def stamp() -> dict:
    """``command`` and ``versions`` for the top of a results JSON."""
    return {"command": command_line(), "versions": versions()}


def command_line() -> str:
    """How this program was started, as a user retypes it from the directory it ran in: the
    command a results file names. ``python -m PKG.MOD ARGS`` when started with ``-m`` (kept
    across dynjax.runtime's re-execution), ``dynjax-NAME ARGS`` for an installed console
    command, else ``python PATH ARGS``; shell-quoted. A main run in-process under another
    program (a test sets ``sys.argv``) is named by that argv. Absolute paths in it are
    made :func:`portable_path` (a results file holds no machine path)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    started_with_m = spec is not None and sys.argv[0] == spec.origin
    args = portable(sys.argv[1:])   # paths as the results file may name them
    if not started_with_m and os.path.basename(sys.argv[0]).startswith("dynjax-"):
        return shlex.join([os.path.basename(sys.argv[0])] + args)
    program = ["-m", spec.name] if started_with_m else [portable_path(sys.argv[0])]
    return "python " + shlex.join(program + args)


def publish_json(result, out=None, indent: int = 1) -> None:
    """A benchmark's answer: ``result`` as JSON on stdout and, with ``out``, written there
    atomically."""
    print(json.dumps(to_python(result), indent=indent))
    if out:
        write_json_atomic(out, result)


def read_json(path, fix: str = "restore it from a copy, or delete it and re-create it"):
    """The JSON in ``path``; a file that does not parse is a :class:`CorruptFile` naming
    ``path``, where it breaks, and ``fix``."""
    path = epath.Path(path)
    text = path.read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CorruptFile(f"{path} is corrupt ({e.msg} at line {e.lineno} column {e.colno}): "
                          f"{fix}") from None


def check_writable(path, what: str) -> None:
    """Raise the ``OSError`` that writing into folder ``path`` would meet (read-only
    filesystem, a file in the way, a full disk), before any compute is spent. Creates
    nothing that stays: the nearest existing ancestor gets a probe file, removed at once.
    ``what`` names the flag (``--workdir``) in the message."""
    if not is_local(path):
        probe = epath.Path(path) / f".dynjax_write_probe.{uuid.uuid4().hex}"
        try:
            probe.write_bytes(b"x")
            probe.unlink()
        except OSError as e:
            raise OSError(e.errno, f"{e.strerror} ({what})", os.fspath(path)) from None
        return
    path = pathlib.Path(path).absolute()
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise OSError(errno.ENOTDIR, f"Not a directory ({what}; {probe} is a file)", str(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".dynjax_write_probe.", dir=probe)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)
            os.unlink(tmp)
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror} ({what})", str(path)) from None


def read_jsonl(path) -> list:
    return [json.loads(line) for line in epath.Path(path).read_text().splitlines()
            if line.strip()]
