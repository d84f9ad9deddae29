"""Variance decomposition of recorded coefficients: descriptive coefficient *variation*.

For an array with named axes (e.g. layer, example, token) in a balanced layout, the total
sum of squares around the grand mean splits into main-effect sums of squares, one per
named factor, plus a residual (all interactions). Share = SS / SS_total. It says how much of
the coefficients' spread is layer identity, input identity or position; it does not say the
model *uses* that spread (the interventions answer that).
"""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from dynjax.coeffs import Coeffs, Schema, is_axes


def decompose(x, names: Sequence[str], factors: Sequence[str] | None = None) -> dict:
    """Shares of the total sum of squares of ``x`` explained by each factor's main effect.

    ``names`` names every axis of ``x``; ``factors`` (default: all of them) are the axes
    whose main effects are reported; every other axis only adds replication. Returns
    ``{factor: share, ..., "residual": share, "total_ss": float}`` in float64.
    """
    x = np.asarray(x, dtype=np.float64)
    names = tuple(names)
    if x.ndim != len(names):
        raise ValueError(f"array of shape {x.shape} but axis names {names}")
    factors = names if factors is None else tuple(f for f in factors if f in names)
    centred = x - x.mean()
    total = float(np.sum(centred ** 2))
    out = {}
    for f in factors:
        i = names.index(f)
        others = tuple(j for j in range(x.ndim) if j != i)
        level_means = centred.mean(axis=others)          # effect of each level of f
        out[f] = float(np.sum(level_means ** 2) * (x.size / x.shape[i]))
    resid = total - sum(out.values())
    shares = {f: (ss / total if total > 0 else np.nan) for f, ss in out.items()}
    shares["residual"] = resid / total if total > 0 else np.nan
    shares["total_ss"] = total
    return shares


def _path_name(path) -> str:
    return jax.tree_util.keystr(path) or "coeffs"


def decompose_coeffs(coeffs: Coeffs, schema: Schema, factors: Sequence[str] | None = None
                     ) -> dict:
    """:func:`decompose` for every leaf, keyed by its tree path (e.g. ``"['gate']"``).

    A list of per-layer leaves with one shape and no ``layer`` axis is stacked along a new
    leading ``layer`` axis first, so layer identity is a factor as in a stacked leaf; lists
    whose shapes differ across layers (MUDD: sources grow with depth) are decomposed per leaf.
    """
    results = {}
    flat_schema = jax.tree_util.tree_flatten_with_path(schema, is_leaf=is_axes)[0]
    lists: dict = {}
    for (path, axes), leaf in zip(flat_schema, jax.tree.leaves(coeffs)):
        if path and isinstance(path[-1], jax.tree_util.SequenceKey) and "layer" not in axes:
            lists.setdefault(path[:-1], []).append((path, axes, leaf))
        else:
            results[_path_name(path)] = decompose(leaf, axes.names, factors)
    for parent, members in lists.items():
        kinds = {(axes.names, np.shape(leaf)) for _, axes, leaf in members}
        if len(members) > 1 and len(kinds) == 1:
            stacked = np.stack([np.asarray(leaf) for _, _, leaf in members])
            results[_path_name(parent)] = decompose(stacked, ("layer",) + members[0][1].names,
                                                    factors)
        else:
            for path, axes, leaf in members:
                results[_path_name(path)] = decompose(leaf, axes.names, factors)
    return results
