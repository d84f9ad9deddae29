"""Memory plan: what one device holds to train a config on a mesh, before anything runs.

    dynjax-plan --config=dynjax:featuregate_76m:feature_gate --mesh=data=8,fsdp=4 \\
        --preset=fsdp [--device-memory=16GiB] [--out=FILE.json]
    python plan.py --config=configs/featuregate_76m.py:feature_gate ...   # from a checkout

Per device: the parameters, the optimizer state and the gradients (shapes only, split as
the rules preset says), the activations kept for the backward pass with and without
rematerialisation, the batch; then whether the total fits each common chip (or
``--device-memory``). Nothing is allocated. Library: ``dynjax.train.memory_plan``; docs/multihost.md.
"""
import sys

from absl import flags
from ml_collections import config_flags

from dynjax import errors, programs

PROG = "plan.py"   # the name errors are reported under (start() sets it)
COMMAND = "plan"
config_flags.DEFINE_config_file("config", None, "dynjax:NAME[:ARG] (from a checkout also "
                                "configs/NAME.py[:ARG]): the training config to plan",
                                lock_config=True)
flags.DEFINE_string("mesh", "data=1", "mesh sizes, e.g. data=8,fsdp=4,tensor=2")
flags.DEFINE_string("preset", "", "rules preset (dp, fsdp, tp, fsdp_tp, ep); default: "
                    "the config's sharding.preset")
flags.DEFINE_string("device-memory", "", "one device's memory, e.g. 16GiB; default: a "
                    "table of common chips")
flags.DEFINE_string("out", "", "also write the plan as JSON here")
flags.mark_flags_as_required(["config"])


def main(argv):
    from dynjax.train import memory_plan

    errors.run_program(PROG, lambda: memory_plan.main(argv))


def start(prog: str = "plan.py"):
    """The program under the name it was started by (``plan.py``, ``dynjax-plan``,
    ``python -m dynjax.programs.plan``)."""
    programs.start(sys.modules[__name__], prog)


if __name__ == "__main__":
    start("dynjax.programs.plan")
