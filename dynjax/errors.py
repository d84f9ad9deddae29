"""The failures a user can fix, and the one way the programs report them.

``train.py`` and ``audit.py`` run their work through :func:`run_program`
and parse their flags with :func:`flags_parser`: a bad ``--config.*`` override, a config
that cannot run, missing or corrupt data, or a checkpoint that cannot be restored ends in
one line ``PROG: error: <problem and fix>`` on stderr and exit status 2 (argparse's code for
a usage error), never a traceback. Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import contextlib
import os
import sys

from dynjax.data.text import DataError

__all__ = ["CheckpointError", "ConfigError", "DataError", "config_errors", "flags_parser",
           "run_program"]

EXIT_USAGE = 2


class ConfigError(ValueError):
    """A config (or its overrides) that cannot run; the message names the field and the fix."""


class CheckpointError(RuntimeError):
    """No checkpoint of a run can be restored; the message names the run, the step, the fix."""


USER_ERRORS = (ConfigError, CheckpointError, DataError)


@contextlib.contextmanager
def config_errors():
    """Inside, a ``ValueError`` (what config validation raises) becomes a :class:`ConfigError`."""
    try:
        yield
    except ConfigError:
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


def run_program(prog: str, fn, errors: tuple = ()):
    """``fn()``; a user error (:data:`USER_ERRORS` or ``errors``) exits via :func:`exit_with_error`."""
    try:
        return fn()
    except (*USER_ERRORS, *errors) as e:
        exit_with_error(prog, e)


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
