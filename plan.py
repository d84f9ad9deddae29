"""Memory plan: what one device holds to train a config on a mesh, before anything runs.

    python plan.py --config=configs/featuregate_76m.py:feature_gate --mesh=data=8,fsdp=4 \
        --preset=fsdp [--device-memory=16GiB] [--out=FILE.json]

(was ``python -m dynjax.plan``; installed: ``dynjax-plan``). Program:
``dynjax/parallel/memory_plan.py``; docs/multihost.md.
"""
from dynjax._alloc import reexec  # the allocator setting, before JAX starts: dynjax/_alloc.py
reexec(__name__)
from dynjax.parallel import memory_plan  # noqa: E402

if __name__ == "__main__":
    memory_plan.start("plan.py")
