"""Where the audit's arrays live when it runs under a device mesh (audit.py's ``sharding``).

One place decides every array's sharding, so the engine's programs stay mesh-agnostic and
record and replay see the same input shardings (one executable, so replay stays exact).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dynjax.coeffs import is_axes
from dynjax.parallel import distributed, sharding
from dynjax.errors import AuditError


class Placement:
    """Where the audit's arrays live on a device mesh (``mesh=None``: JAX's default device).

    Parameters follow the rules table (their logical axes, else replicated); a batch of rows
    and every coefficient array's ``example`` axis split over the data-parallel axes (data x
    fsdp), so record, replay, take, write and reassign all work on split windows; results
    the host reads come back replicated, so every process of a multi-host run can read them.
    """

    def __init__(self, mesh=None, rules=sharding.DEFAULT_RULES):
        self.mesh, self.rules = mesh, rules
        self.dp = 1 if mesh is None else sharding.data_parallel_size(mesh)

    def check_rows(self, rows: int):
        if rows % self.dp:
            raise AuditError(f"{rows} rows per forward is not a multiple of the {self.dp} "
                             f"data-parallel devices (mesh data x fsdp = "
                             f"{self.mesh.shape['data']} x {self.mesh.shape['fsdp']}); set "
                             f"batch_size (and the window counts) to a multiple of {self.dp}")

    def params(self, params, logical_axes=None):
        """``params`` placed by the rules (``logical_axes``: their logical specs); without a
        mesh, on the default device (host arrays would be copied at every forward)."""
        if self.mesh is None:
            return jax.device_put(params)
        if jax.process_count() > 1:   # host copies: every process holds the same values
            params = jax.tree.map(np.asarray, jax.device_get(params))
        shard = (sharding.replicated(self.mesh) if logical_axes is None else
                 sharding.param_shardings(logical_axes, self.mesh, self.rules))
        return jax.device_put(params, shard)

    def batch(self, batch):
        """A host batch (leading axis: rows) split over the data-parallel axes; one already
        placed (device arrays) is returned as is."""
        if self.mesh is None:
            return jax.tree.map(jnp.asarray, batch)
        if all(isinstance(a, jax.Array) for a in jax.tree.leaves(batch)):
            return batch
        return distributed.put_global(sharding.batch_sharding(self.mesh), batch)

    def coeff_shardings(self, schema, n_examples: int):
        """Each leaf's NamedSharding: its ``example`` axis split when ``n_examples`` divides
        evenly over the data-parallel devices, else replicated (None without a mesh)."""
        if self.mesh is None:
            return None
        split = n_examples % self.dp == 0

        def one(axes):
            spec = [None] * len(axes.names)
            if split:
                spec[axes.index("example")] = sharding.BATCH_AXES
            return jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(*spec))
        return jax.tree.map(one, schema, is_leaf=is_axes)

    def coeffs(self, schema, tree):
        """Coefficients (example axis: rows) moved to their canonical sharding, so the forward
        sees the same input shardings in record and replay (one executable)."""
        if self.mesh is None:
            return tree
        axes = jax.tree.leaves(schema, is_leaf=is_axes)[0]
        n = jax.tree.leaves(tree)[0].shape[axes.index("example")]
        return jax.device_put(tree, self.coeff_shardings(schema, n))

    def flag(self, replay: bool):
        """The Given's flag, replicated over the mesh."""
        flag = np.asarray(replay, bool)
        return jnp.asarray(flag) if self.mesh is None else jax.device_put(
            flag, sharding.replicated(self.mesh))

    def jit_to_host(self, fn):
        """``fn`` jitted with replicated outputs under a mesh (readable by every process)."""
        if self.mesh is None:
            return jax.jit(fn)
        return jax.jit(fn, out_shardings=sharding.replicated(self.mesh))
