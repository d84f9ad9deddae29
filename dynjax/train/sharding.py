"""Device mesh and logical-axis sharding: one rules table maps parameter axes to mesh axes.

The mesh has axes ("data", "model"). Batches split over "data"; parameters follow the
config's rules, e.g. ``("mlp", "model")`` for tensor parallelism, ``("expert", "model")``
for expert parallelism (MoE / MoDE) or ``("embed", "data")`` for FSDP. With the default
rules every parameter is replicated: pure data parallelism, so the same command runs on one
CPU, 8 GPUs or a TPU host.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

DEFAULT_RULES = (("batch", "data"), ("layers", None), ("embed", None), ("heads", None),
                 ("kv", None), ("mlp", None), ("vocab", None), ("expert", None))


def make_mesh(model_parallel: int = 1) -> Mesh:
    devices = jax.devices()
    if len(devices) % model_parallel:
        raise ValueError(f"sharding.model_parallel={model_parallel} does not divide the "
                         f"{len(devices)} available devices")
    return Mesh(np.array(devices).reshape(-1, model_parallel), ("data", "model"))


def param_shardings(logical_specs, mesh: Mesh, rules=DEFAULT_RULES):
    """NamedSharding for every parameter from its logical axis names."""
    return nn.logical_to_mesh_sharding(logical_specs, mesh, [tuple(r) for r in rules])


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P("data"))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def check_batch(batch_size: int, mesh: Mesh):
    n = mesh.shape["data"]
    if batch_size % n:
        raise ValueError(f"batch size {batch_size} is not divisible by the {n} data-parallel "
                         f"devices; set train.batch_size to a multiple of {n}")
