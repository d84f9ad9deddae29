"""The execution scorecard: does each checkpoint vary, depend on it, and execute less?

The program is ``dynjax/programs/scorecard.py`` (its usage and flags: ``python scorecard.py --help``);
installed, the same program is the ``dynjax-scorecard`` command.
"""
from dynjax.runtime import setup  # the allocator setting, before JAX starts: dynjax/runtime.py
setup(__name__)
from dynjax.programs import scorecard  # noqa: E402

if __name__ == "__main__":
    scorecard.start("scorecard.py")
