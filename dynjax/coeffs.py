"""The coefficient contract: what a recorded coefficient pytree looks like, and its axes.

Every model family returns ``logits, coeffs = apply(params, tokens)`` and accepts
``apply(params, tokens, coeffs=coeffs)`` to replay them verbatim. ``coeffs`` is a plain
pytree of arrays. Its *schema* is a pytree of the same structure whose leaves are
:class:`Axes`, naming each array axis. Interventions (``dynjax.audit.interventions``) are
written once against these names, never per model family.

Axis vocabulary (use these names, so generic interventions understand a new family):

- ``layer``   target layer (absent when a list of per-layer leaves carries the layer instead)
- ``example`` the batch / input index: cross-input reassignment permutes it
- ``token``   the sequence position: token shuffles permute it
- ``stream``  a computation stream (MUDD's q/k/v/r inputs)
- ``source``  a source layer that is mixed (MUDD)
- ``unit``    a hidden unit or block of units (DynamicGate-MLP)
- ``expert``  an expert (MoE routing values)
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

AXIS_NAMES = ("layer", "example", "token", "stream", "source", "unit", "expert")

Coeffs = Any  # a pytree of arrays
Schema = Any  # a pytree of Axes with the structure of Coeffs


@dataclasses.dataclass(frozen=True)
class Axes:
    """Names of the axes of one coefficient leaf, e.g. ``Axes(("layer", "example", "token"))``.

    Not registered as a pytree node, so it is a leaf of a schema pytree and
    ``jax.tree.map(f, coeffs, schema)`` pairs every array with its names.
    """

    names: tuple[str, ...]

    def __post_init__(self):
        names = tuple(self.names)
        object.__setattr__(self, "names", names)
        unknown = [n for n in names if n not in AXIS_NAMES]
        if unknown:
            raise ValueError(f"unknown coefficient axis {unknown}; use one of {AXIS_NAMES}")
        if len(set(names)) != len(names):
            raise ValueError(f"repeated axis name in {names}")

    def index(self, name: str) -> int | None:
        """Position of axis ``name`` in this leaf, or None if the leaf lacks it."""
        return self.names.index(name) if name in self.names else None

    def __contains__(self, name: str) -> bool:
        return name in self.names


def is_axes(x) -> bool:
    return isinstance(x, Axes)


def map_with_axes(fn, coeffs: Coeffs, schema: Schema):
    """``fn(array, axes)`` over every leaf of ``coeffs`` paired with its :class:`Axes`."""
    return jax.tree.map(lambda axes, a: fn(a, axes), schema, coeffs, is_leaf=is_axes)


def check(coeffs: Coeffs, schema: Schema) -> None:
    """Raise a clear error if ``coeffs`` does not match ``schema`` (structure and ranks)."""
    s_struct = jax.tree.structure(schema, is_leaf=is_axes)
    c_struct = jax.tree.structure(coeffs)
    if s_struct.num_leaves != c_struct.num_leaves or jax.tree.structure(
        jax.tree.map(lambda _: 0, schema, is_leaf=is_axes)) != c_struct:
        raise ValueError(
            f"coefficients have structure {c_struct} but the model's schema is {s_struct}; "
            "pass the coeffs pytree returned by the same model's record call")

    def _rank(a, axes):
        if np.ndim(a) != len(axes.names):
            raise ValueError(f"coefficient of shape {np.shape(a)} does not have the axes "
                             f"{axes.names} of the schema")
        return a

    map_with_axes(_rank, coeffs, schema)


def axis_size(coeffs: Coeffs, schema: Schema, name: str) -> int:
    """The common size of axis ``name`` across all leaves that have it (error if they differ)."""
    sizes = set()
    map_with_axes(lambda a, ax: sizes.add(a.shape[ax.index(name)]) if name in ax else None,
                  coeffs, schema)
    if len(sizes) != 1:
        raise ValueError(f"axis {name!r} has sizes {sorted(sizes)} across leaves; expected one")
    return sizes.pop()
