"""Train any dynjax model: ``python train.py --config=configs/NAME.py[:ARG] --workdir=DIR``.

The program is ``dynjax/programs/train.py`` (its usage and flags: ``python train.py --help``);
installed, the same program is the ``dynjax-train`` command.
"""
from dynjax.runtime import setup  # the allocator setting, before JAX starts: dynjax/runtime.py
setup(__name__)
if __name__ == "__main__":   # signals handled from the start, before JAX is imported
    from dynjax.train import preempt
    preempt.from_the_start()
from dynjax.programs import train  # noqa: E402

if __name__ == "__main__":
    train.start("train.py")
