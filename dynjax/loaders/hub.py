"""Hugging Face repo ids (``ORG/NAME``, ``ORG/NAME@REVISION``) found offline in the local
Hugging Face cache, so ``hf.load("allenai/OLMoE-1B-7B-0924")`` and ``dynjax-sample
Qwen/Qwen3-30B-A3B`` open what ``hf download`` (or transformers) already put there.

Nothing here downloads: a repo id not in the cache is one line saying where it was looked
for. Depth: docs/hf.md#repo-ids-offline-dynjaxloadershubpy
"""
from __future__ import annotations

import os
import pathlib
import re

from dynjax.errors import CheckpointError

__all__ = ["cache_dir", "is_repo_id", "local_path", "resolve", "snapshot", "split"]

_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+")
DEFAULT_REVISION = "main"


def cache_dir() -> pathlib.Path:
    """The hub cache folder, as huggingface_hub finds it from the environment."""
    if os.environ.get("HF_HUB_CACHE"):
        return pathlib.Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    return pathlib.Path(home).expanduser() / "hub"


def split(spec: str) -> tuple[str, str | None]:
    """``"ORG/NAME@REV"`` -> ``("ORG/NAME", "REV")``; no ``@``: revision None."""
    repo, sep, rev = str(spec).partition("@")
    return repo, (rev if sep else None)


def is_repo_id(spec) -> bool:
    """Whether ``spec`` reads as ``ORG/NAME[@REV]`` (not an absolute or ./ path)."""
    return bool(_REPO_ID.fullmatch(split(str(spec))[0])) and not str(spec).startswith(".")


def _from_huggingface_hub(repo: str, revision: str, cache: pathlib.Path):
    """The snapshot huggingface_hub's offline lookup names (None: not installed, or it has
    no config.json there)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo, "config.json", cache_dir=str(cache),
                                       revision=revision, repo_type="model")
    except Exception:   # noqa: BLE001 - its validators reject names ours accept: ours decides
        return None
    return pathlib.Path(found).parent if isinstance(found, str) else None


def _from_layout(repo: str, revision: str, cache: pathlib.Path):
    """The snapshot folder by the cache layout alone (None if absent)."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    ref = folder / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snap = folder / "snapshots" / commit
    return snap if snap.is_dir() else None


USE_HUGGINGFACE_HUB = True   # False: the layout reader alone (the tests compare both)


def snapshot(repo: str, revision: str | None = None, cache=None) -> pathlib.Path | None:
    """The cached snapshot folder of ``repo`` at ``revision`` (default main), or None."""
    cache = pathlib.Path(cache) if cache is not None else cache_dir()
    revision = revision or DEFAULT_REVISION
    found = _from_huggingface_hub(repo, revision, cache) if USE_HUGGINGFACE_HUB else None
    return found or _from_layout(repo, revision, cache)


def resolve(spec, revision: str | None = None) -> str:
    """A local checkpoint directory for ``spec``: an existing path as it is; a repo id
    (``ORG/NAME``, ``ORG/NAME@REV``, or ``revision=``) as its cached snapshot, else a
    :class:`CheckpointError` naming the folder looked in. Other paths come back as given
    (the loader's own error names them)."""
    spec = os.fspath(spec)
    if os.path.exists(spec) or not is_repo_id(spec):
        return spec
    repo, rev = split(spec)
    rev = revision or rev
    found = snapshot(repo, rev)
    if found is None:
        where = cache_dir() / ("models--" + repo.replace("/", "--"))
        raise CheckpointError(
            f"{spec} is not a local directory and the Hugging Face cache has no snapshot of "
            f"{repo} at revision {rev or DEFAULT_REVISION} (looked in {where}; the cache is "
            "$HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub): download it "
            f"first (`hf download {repo}`) or pass the checkpoint's directory")
    return str(found)


def local_path(spec, required: bool = False) -> str:
    """:func:`resolve` for a program's checkpoint argument: a repo id found in the cache
    becomes its snapshot; one not found is an error only if ``required`` (the argument must
    be an HF checkpoint), else ``spec`` comes back for the caller's own message."""
    try:
        return resolve(spec)
    except CheckpointError:
        if required:
            raise
        return os.fspath(spec)
