"""Device mesh and logical-axis sharding: one rules table maps logical axes to mesh axes.

The mesh's axes are ``("data", "fsdp", "tensor")``, sized by ``sharding.mesh``; batches
split over data and fsdp, fsdp also shards parameters and optimizer state, tensor splits
heads, MLP columns or experts. ``sharding.preset`` picks a rules table (:data:`PRESETS`),
``sharding.rules`` replaces it; ``sharding.dcn_data`` builds a multi-slice mesh. The same
command runs on one CPU or a pod: docs/multihost.md (The mesh and its rules).
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dynjax.errors import ConfigError

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# logical axis -> mesh axis. "layers" (the scanned layer axis) is never sharded: a scan
# slices one layer per iteration.
_REPLICATED = (("batch", BATCH_AXES), ("layers", None), ("embed", None), ("heads", None),
               ("kv", None), ("mlp", None), ("vocab", None), ("expert", None))


def _preset(**overrides):
    return tuple((name, overrides.get(name, axis)) for name, axis in _REPLICATED)


PRESETS = {
    # pure data parallelism: every parameter replicated
    "dp": _preset(),
    # FSDP: parameters and optimizer state split along their embedding (or input) axis
    "fsdp": _preset(embed="fsdp"),
    # tensor parallelism (Megatron): heads, MLP columns and the vocabulary split over "tensor"
    "tp": _preset(heads="tensor", mlp="tensor", vocab="tensor"),
    "fsdp_tp": _preset(embed="fsdp", heads="tensor", mlp="tensor", vocab="tensor"),
    # expert parallelism: MoE experts over "tensor" (each device holds whole experts); a
    # dropless MoE traced under these rules sends its tokens to the experts by all-to-all
    # (dynjax.models.dispatch.dropless_expert_parallel)
    "ep": _preset(expert="tensor"),
    # both: experts over "tensor", every parameter's embedding axis over "fsdp", and the
    # heads axis over "fsdp" where the parameter has no embedding axis (rules are tried in
    # order; a mesh axis is used once per parameter): low-rank query and grouped output
    # projections, MLA's up-projections. How a checkpoint too large for "ep" alone is held:
    # DeepSeek-V4-Flash, V3.2; docs/hf.md
    "fsdp_ep": _preset(embed="fsdp", heads="fsdp", expert="tensor"),
}
DEFAULT_RULES = PRESETS["dp"]


def rules_of(sc) -> tuple:
    """The rules table of a ``config.sharding``: ``rules`` if given, else the preset's."""
    if sc.get("rules"):
        return tuple(tuple(r) for r in sc.rules)
    preset = sc.get("preset", "dp")
    if preset not in PRESETS:
        raise ConfigError(f"sharding.preset={preset!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[preset]


def mesh_shape(sizes, n_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) from a {axis: size} dict where one size may be -1."""
    unknown = [a for a in AXES if int(sizes.get(a, 1)) == -1]
    if len(unknown) > 1:
        raise ConfigError(f"sharding.mesh: only one axis may be -1, got {unknown}")
    fixed = math.prod(int(sizes.get(a, 1)) for a in AXES if a not in unknown)
    if fixed <= 0 or n_devices % fixed:
        raise ConfigError(f"sharding.mesh={dict(sizes)} does not divide the {n_devices} "
                          "available devices")
    shape = tuple(n_devices // fixed if a in unknown else int(sizes.get(a, 1)) for a in AXES)
    if math.prod(shape) != n_devices:
        raise ConfigError(f"sharding.mesh={dict(sizes)} uses {math.prod(shape)} devices, but "
                          f"{n_devices} are available; set one axis to -1")
    return shape


def make_mesh(sc=None, devices=None) -> Mesh:
    """The ("data", "fsdp", "tensor") mesh of a ``config.sharding`` over all devices (every
    process's). Without a config: pure data parallelism."""
    devices = jax.devices() if devices is None else devices
    sizes = dict(sc.mesh) if sc is not None and sc.get("mesh") else {"data": -1}
    shape = mesh_shape(sizes, len(devices))
    dcn = int(sc.get("dcn_data", 1)) if sc is not None else 1
    if devices[0].platform == "cpu" or len(devices) == 1:
        return Mesh(np.array(devices).reshape(shape), AXES)
    if dcn > 1:
        if shape[0] % dcn:
            raise ConfigError(f"sharding.dcn_data={dcn} does not divide the data axis "
                              f"({shape[0]})")
        grid = mesh_utils.create_hybrid_device_mesh(
            (shape[0] // dcn, shape[1], shape[2]), (dcn, 1, 1), devices,
            allow_split_physical_axes=True)
    else:
        grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
    return Mesh(grid, AXES)


def param_shardings(logical_specs, mesh: Mesh, rules=DEFAULT_RULES):
    """NamedSharding for every parameter from its logical axis names."""
    return nn.logical_to_mesh_sharding(logical_specs, mesh, [tuple(r) for r in rules])


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (example) axis over every data-parallel mesh axis."""
    return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def data_parallel_size(mesh: Mesh) -> int:
    return math.prod(mesh.shape[a] for a in BATCH_AXES)


def check_batch(batch_size: int, mesh: Mesh, field: str = "train.batch_size"):
    n = data_parallel_size(mesh)
    if batch_size % n:
        raise ConfigError(f"{field}={batch_size} is not divisible by the {n} data-parallel "
                          f"devices (mesh data x fsdp = {mesh.shape['data']} x "
                          f"{mesh.shape['fsdp']}); set {field} to a multiple of {n}")


def check_divisible(shapes, logical_specs, mesh_sizes: dict, rules=DEFAULT_RULES,
                    where: str = "parameter") -> None:
    """A ConfigError naming the first array of ``shapes`` whose sharded dimension the mesh
    does not divide (JAX's IndivisibleError, raised only at the first step, as one line)."""
    rules = [tuple(r) for r in rules]
    flat_specs = jax.tree_util.tree_leaves(
        logical_specs, is_leaf=lambda s: isinstance(s, P) or s is None)
    flat = jax.tree_util.tree_flatten_with_path(shapes)[0]
    for (path, x), spec in zip(flat, flat_specs):
        mesh_axes = tuple(nn.logical_to_mesh_axes(spec, rules)) if spec is not None else ()
        for dim, axes in zip(x.shape, mesh_axes):
            axes = tuple(a for a in (axes if isinstance(axes, tuple) else (axes,)) if a)
            n = math.prod(mesh_sizes[a] for a in axes)
            if n > 1 and dim % n:
                named = " x ".join(f"{a}={mesh_sizes[a]}" for a in axes)
                raise ConfigError(
                    f"{where} {jax.tree_util.keystr(path)} has a dimension of {dim}, which "
                    f"the mesh's {named} does not divide (its {spec} is sharded over "
                    f"{', '.join(axes)}): choose mesh sizes that divide the model's "
                    "dimensions, or another sharding.preset")
