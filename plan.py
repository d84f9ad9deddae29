"""Memory plan: ``python plan.py --config=configs/NAME.py[:ARG] --mesh=data=8,fsdp=4``.

The program is ``dynjax/programs/plan.py`` (its usage and flags: ``python plan.py --help``);
installed, the same program is the ``dynjax-plan`` command.
"""
from dynjax.runtime import setup  # the allocator setting, before JAX starts: dynjax/runtime.py
setup(__name__)
from dynjax.programs import plan  # noqa: E402

if __name__ == "__main__":
    plan.start("plan.py")
