"""The command-line programs, as console commands (``pip install`` puts them on PATH) and
behind the checkout's thin shells (``train.py``, ``audit.py``, ``scorecard.py``,
``sample.py``, ``plan.py``): each entry point applies the allocator setting
(``dynjax.runtime``) before JAX is imported, then runs the program under its own name.
``dynjax-fetch`` is :mod:`dynjax.data.fetch`, which needs neither."""
import importlib


def _run(module: str, prog: str):
    from dynjax.runtime import setup

    setup("__main__")   # a console command is the main program: re-execute once
    importlib.import_module(module).start(prog)


def train():
    _run("dynjax.programs.train", "dynjax-train")


def audit():
    _run("dynjax.programs.audit", "dynjax-audit")


def scorecard():
    _run("dynjax.programs.scorecard", "dynjax-scorecard")


def sample():
    _run("dynjax.programs.sample", "dynjax-sample")


def plan():
    _run("dynjax.programs.plan", "dynjax-plan")


def fetch():
    """``dynjax-fetch [GROUP ...]``: the data archives, by group (no JAX, no re-execution)."""
    import sys

    from dynjax.data import fetch as data_fetch

    sys.exit(data_fetch.main(prog="dynjax-fetch"))


def export():
    """``dynjax-export RUN_DIR OUT_DIR``: an llm-family run as a Hugging Face directory."""
    import sys

    from dynjax.runtime import setup

    setup("__main__")
    from dynjax import export as export_lib

    sys.exit(export_lib.main(prog="dynjax-export"))
