"""The failures a user can fix, and the one way the programs report them.

Every such failure is a :class:`DynjaxError` (one subclass per kind) whose message names the
problem and the fix. ``train.py``, ``audit.py`` and the other programs run their work
through :func:`run_program` and parse flags with :func:`flags_parser`: a ``DynjaxError``, a
bad flag or a filesystem error (``OSError``) ends in one line ``PROG: error: ...`` on stderr
and exit status 2, never a traceback. Anything else is a bug and keeps its traceback. The
exit statuses are in docs/reliability.md.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import sys

__all__ = ["AuditError", "CheckpointError", "ConfigError", "CorruptFile", "DataError",
           "DynjaxError", "NonFiniteError", "ReplayError", "RunLocked", "config_errors",
           "describe_os_error", "flags_parser", "run_program"]

EXIT_USAGE = 2


class DynjaxError(Exception):
    """A failure the user can fix; the message names the problem and the fix. Raise the
    subclass that says what failed; catch this one to report any of them."""


class ConfigError(DynjaxError, ValueError):
    """A config (or its overrides) that cannot run; the message names the field and the fix."""


class CheckpointError(DynjaxError, RuntimeError):
    """A checkpoint that cannot be found, recognised or restored; the message names the path
    (run, step) and the fix."""


class DataError(DynjaxError, RuntimeError):
    """Missing or corrupt data; the message names the fix."""


class CorruptFile(DynjaxError, ValueError):
    """A JSON file that does not parse; the message names the file, the place and the fix."""


class NonFiniteError(DynjaxError, RuntimeError):
    """Training produced a non-finite loss or gradient; the message names the step and the
    newest (finite) checkpoint, from which a re-run resumes."""


class RunLocked(DynjaxError, RuntimeError):
    """Another live process is writing the run directory; the message names its pid."""


class AuditError(DynjaxError, ValueError):
    """An audit that cannot run as asked (settings, windows, checkpoints that do not go
    together); the message names the fix."""


class ReplayError(DynjaxError, RuntimeError):
    """Replay of the cached coefficients did not reproduce the record."""


USER_ERRORS = (DynjaxError,)

# what to do about a filesystem error, by errno
_OS_FIXES = {
    errno.ENOSPC: "free space on that filesystem (or choose a path on another one)",
    errno.EDQUOT: "free space within your quota (or choose a path on another filesystem)",
    errno.EROFS: "the filesystem is read-only: choose a path on a writable one",
    errno.EACCES: "you may not write there: choose a path you own",
    errno.EPERM: "you may not write there: choose a path you own",
    errno.ENOTDIR: "a component of the path is a file, not a folder: choose another path",
    errno.EEXIST: "a file is in the way: remove it or choose another path",
    errno.ENOENT: "the folder does not exist: create it or choose another path",
    errno.EISDIR: "the path is a folder: name a file inside it",
}


def describe_os_error(e: OSError, then: str = "") -> str:
    """An ``OSError`` in one line: the path, the errno by name and number, what to do."""
    code = e.errno
    name = errno.errorcode.get(code, "?") if code is not None else "?"
    path = e.filename if e.filename is not None else "(unnamed path)"
    fix = _OS_FIXES.get(code, "check the path and its filesystem")
    return (f"cannot write {path}: {e.strerror or e} (errno {code}, {name}); {fix}"
            + (f"; {then}" if then else ""))


@contextlib.contextmanager
def config_errors():
    """Inside, a plain ``ValueError`` (what config validation raises) becomes a
    :class:`ConfigError`; a :class:`DynjaxError` passes through as it is."""
    try:
        yield
    except DynjaxError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from e


def exit_with_error(prog: str, message) -> None:
    """Print ``PROG: error: MESSAGE`` (one line) to stderr and exit with status 2.

    The exit skips interpreter teardown (``os._exit``): a failed orbax read leaves I/O
    callbacks that print tracebacks into a closed event loop at shutdown, after our one
    line. Nothing is lost by skipping it: every file dynjax writes is replaced atomically.
    """
    line = " ".join(str(message).split())
    print(f"{prog}: error: {line}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_USAGE)


def missing_package(e: ImportError) -> str | None:
    """A remote path's missing filesystem package (etils/fsspec: "Please install gcsfs to
    access Google Storage") as one line naming what to install; None for any other
    ImportError (a bug: it keeps its traceback)."""
    m = re.search(r"[Ii]nstall ([A-Za-z][A-Za-z0-9_.-]*) to access", str(e))
    if not m:
        return None
    return (f"{e}: a gs:// (or other remote) path needs the {m.group(1)} package; "
            f"pip install {m.group(1)} (and its credentials), or use a local path")


def run_program(prog: str, fn, errors: tuple = (), os_hint=""):
    """``fn()``; a user error (a :class:`DynjaxError`, or one of ``errors``), a filesystem error
    (``OSError``, followed by ``os_hint``: a string, or a function of nothing that returns
    it when the error happens) or a remote path's missing package exits via
    :func:`exit_with_error`."""
    try:
        return fn()
    except (*USER_ERRORS, *errors) as e:
        exit_with_error(prog, e)
    except OSError as e:
        exit_with_error(prog, describe_os_error(e, os_hint() if callable(os_hint) else os_hint))
    except ImportError as e:
        line = missing_package(e)
        if line is None:
            raise
        exit_with_error(prog, line)


def flags_parser(prog: str):
    """An ``absl.app.run(..., flags_parser=)`` that turns a bad flag or ``--config.*``
    override (unknown field, wrong type, bad value) into one line and exit status 2."""
    def parse(argv):
        from absl import flags
        try:
            rest = flags.FLAGS(argv)
            if "config" in flags.FLAGS and flags.FLAGS.config is not None:
                flags.FLAGS.config.keys()      # a config file that failed to load raises here
            return rest
        except (flags.Error, AttributeError, KeyError, OSError, TypeError, ValueError) as e:
            why = str(e).strip()
            if len(why) > 1 and why[0] == why[-1] and why[0] in "'\"":   # a KeyError's repr
                why = why[1:-1].replace("\\n", "; ").replace("\\'", "'")
            if "Traceback (most recent call last)" in why:   # a config file's get_config raised
                why = why.splitlines()[-1]
            exit_with_error(prog, f"bad command line: {why}")
    return parse
