"""Coefficient families: the audit's conditions applied to one group of coefficient leaves at
a time, every other leaf replayed as recorded.

A model that records several kinds of coefficient asks one question per kind (a condition
on all leaves at once mixes the questions), so the audit reports one table per family: a
name and the top-level keys it covers (by default one per key, :func:`of_schema`).
:func:`restrict` runs a generic condition on the family's sub-pytree only.
Depth: docs/audit.md#coefficient-families-dynjaxauditfamiliespy
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

from dynjax.errors import AuditError

Families = Mapping[str, tuple]   # family name -> the top-level coefficient keys it covers


def of_schema(schema, grouped: Families | None = None) -> dict[str, tuple]:
    """One family per top-level key of a dict schema, except the keys ``grouped`` gathers
    under one name (e.g. ``{"mhc": ("mhc_attn", "mhc_ffn", "mhc_head")}``); {} for a schema
    that is not a dict (a per-layer list: one family, the whole pytree)."""
    if not isinstance(schema, Mapping):
        return {}
    grouped = {n: tuple(k for k in keys if k in schema) for n, keys in (grouped or {}).items()}
    grouped = {n: keys for n, keys in grouped.items() if keys}
    taken = {k for keys in grouped.values() for k in keys}
    out = {}
    for key in schema:
        if key in taken:
            name = next(n for n, keys in grouped.items() if key in keys)
            out.setdefault(name, grouped[name])
        else:
            out[key] = (key,)
    return out


def select(families: Families, sites) -> dict[str, tuple]:
    """The families named by ``sites`` (a comma-separated string or a sequence; None, "" or
    "all": every family), in the model's order. An unknown name is an :class:`AuditError`
    naming the ones the checkpoint has."""
    if sites is None or (isinstance(sites, str) and sites.strip() in ("", "all")):
        return dict(families)
    names = [s.strip() for s in sites.split(",")] if isinstance(sites, str) else list(sites)
    names = [n for n in names if n]
    unknown = [n for n in names if n not in families]
    if unknown:
        raise AuditError(f"unknown coefficient site(s) {unknown}: this checkpoint records "
                         f"{list(families) or 'no families'}; pass --config.sites= a "
                         "comma-separated subset of those (or 'all')")
    return {n: tuple(keys) for n, keys in families.items() if n in names}


def keys_of(families: Families) -> tuple:
    """Every top-level key the families cover, in order."""
    return tuple(k for keys in families.values() for k in keys)


def sub(tree, keys: Sequence[str] | None):
    """The dict ``tree`` restricted to ``keys`` (None: the whole tree)."""
    return tree if keys is None else {k: tree[k] for k in keys}


def restrict(fn: Callable, keys: Sequence[str] | None) -> Callable:
    """``fn(coeffs, schema, key_or_calib, **needs)`` applied to the leaves under ``keys``
    only (the calibration cache restricted alike); the other leaves returned unchanged.
    ``keys=None``: ``fn`` itself."""
    if keys is None:
        return fn
    keys = tuple(keys)

    def on_family(coeffs, schema, arg, **needs):
        if isinstance(arg, Mapping):         # a deterministic condition's calibration cache
            arg = sub(arg, keys)
        return {**coeffs, **fn(sub(coeffs, keys), sub(schema, keys), arg, **needs)}
    return on_family
