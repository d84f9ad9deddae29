"""Frozen-Controller Audit: does a trained dynamic model depend on its coefficients?

The program is ``dynjax/programs/audit.py`` (its usage and flags: ``python audit.py --help``);
installed, the same program is the ``dynjax-audit`` command.
"""
from dynjax.runtime import setup  # the allocator setting, before JAX starts: dynjax/runtime.py
setup(__name__)
from dynjax.programs import audit  # noqa: E402

if __name__ == "__main__":
    audit.start("audit.py")
