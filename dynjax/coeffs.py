"""The coefficient contract: what a recorded coefficient pytree looks like, and its axes.

Every family returns ``logits, coeffs = apply(params, tokens)`` and replays them verbatim
with ``apply(params, tokens, coeffs=coeffs)``. Every coefficient passes one :func:`site`,
which selects the given or the computed values by a flag that is data (:class:`Given`), so
record and replay are one compiled program. A schema names each leaf's axes (:class:`Axes`)
from one vocabulary, so interventions are written once. The vocabulary: docs/models.md.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

AXIS_NAMES = ("layer", "example", "token", "stream", "source", "unit", "expert", "head",
              "hc", "hc_in", "key")

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


# --------------------------------------------------------------- record and replay sites

class Given(NamedTuple):
    """What a model's coefficient sites select from, so record and replay are one program.

    ``values``: a coefficient pytree (the model's schema), or None when nothing is given.
    ``replay``: a boolean scalar *array*: True selects ``values``, False the controller's
    computed values. Because the flag is data, not Python, one compiled program serves both
    modes: the controller always runs, and every array after the sites is computed by the
    same executable from bitwise the same inputs. Replay is then exact by construction,
    whatever XLA fuses (no numeric ties, no barriers around the combine steps).
    """

    values: Any
    replay: Any


def part(given: "Given | None", fn, layers: int | None = None) -> "Given | None":
    """The same flag with ``fn(values)`` (a layer's slice, one leaf); None stays None. With
    ``layers`` the flag is broadcast to (layers,), so a layer scan slices it with the values."""
    if given is None:
        return None
    replay = given.replay if layers is None else jnp.broadcast_to(given.replay, (layers,))
    return Given(None if given.values is None else fn(given.values), replay)


def recording(values=None) -> Given:
    """Record: the sites select their computed values. Pass zeros with the coefficients'
    shapes (``zeros_like``) to call the very program that replays (the audit does)."""
    return Given(values, jnp.zeros((), bool))


def replaying(coeffs: Coeffs) -> Given:
    """Replay: the sites select ``coeffs`` verbatim."""
    return Given(coeffs, jnp.ones((), bool))


def as_given(coeffs) -> Given:
    """The public ``coeffs=`` argument as a :class:`Given`: None records, a coefficient
    pytree replays, a Given is used as is.

    The flag passes an ``optimization_barrier``: when a caller's ``jax.jit`` makes it a
    constant, XLA can then neither fold the selection nor drop the controller, so the record
    and the replay that caller traces stay the same computation (one executable needs a
    Given argument, as the audit engine passes)."""
    given = coeffs if isinstance(coeffs, Given) else (
        recording() if coeffs is None else replaying(coeffs))
    return Given(given.values, jax.lax.optimization_barrier(jnp.asarray(given.replay, bool)))


def zeros_like(shapes) -> Coeffs:
    """Zeros with the shapes and dtypes of a coefficient pytree (arrays or ShapeDtypeStructs)."""
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def site(computed, given: "Given | None"):
    """The one coefficient site every family calls: ``computed`` (the controller's values, a
    pytree) where ``given.replay`` is False, ``given.values`` (cast to the computed dtype)
    where it is True; nothing given (None, or values None) selects against zeros.

    ``jnp.where`` with a scalar flag is exact and never mixes the branches, so the result is
    bitwise the computed values at record and bitwise the given ones at replay, even where the
    other branch is not finite. ``given=None`` (no replay input at all, e.g. KV-cache
    decoding) returns ``computed`` unchanged."""
    if given is None:
        return computed
    values = given.values
    if values is None:
        values = jax.tree.map(jnp.zeros_like, computed)
    return jax.tree.map(lambda c, v: jnp.where(given.replay, v.astype(c.dtype), c),
                        computed, values)
