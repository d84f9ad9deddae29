"""The command-line programs (``dynjax.programs.console``: their console commands)."""
import sys


def start(program, prog: str):
    """Run ``program`` (a program module: ``main``, ``PROG``, its docstring as --help) under
    the name it was started by (``train.py``, ``dynjax-train``): errors are reported under it."""
    from absl import app

    from dynjax import configs, errors

    program.PROG = prog
    sys.modules["__main__"].__doc__ = program.__doc__   # what --help prints
    app.run(program.main, argv=configs.expand(prog, sys.argv),
            flags_parser=errors.flags_parser(prog))
