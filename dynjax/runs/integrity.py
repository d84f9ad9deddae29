"""Is a checkpoint what was saved, and is it finite? Per-array digests, computed on device.

At every save the trainer records each array's digest inside the checkpoint, in orbax's step
metadata (``checkpoints/S/_CHECKPOINT_METADATA``, key :data:`KEY`), which orbax writes into
the step's temporary directory before it renames it into place: a checkpoint and its digests
are committed together, so no kill can leave one without the other. Every restore (resume, and the audit's parameters-only read) computes
the digests of what it read and compares. A bit flipped in a checkpoint file (on disk, in a
copy) that orbax reads without complaint is caught here.

The digest is two position-weighted sums of the array's 32-bit words modulo 2**32
(``sum(w)`` and ``sum(w * (odd constant * i + 1))``): integer sums are exact in any order,
so it is the same on any mesh, process count or device, and it runs where the array lives
(no copy to the host). Any single flipped bit changes the first sum; swapped elements change
the second. It guards against damage, not against tampering. The same pass reports whether
every floating-point entry is finite, which is how a non-finite state is never saved.

A checkpoint without readable digests (written by a dynjax that kept them in a separate
:data:`FILE` and was killed between orbax's commit and that write, or whose metadata file
was damaged) cannot be verified: resume prefers an older verified checkpoint, and a restore
of an unverified one says so (:data:`UNVERIFIED`); see dynjax/train/checkpoint.py.
"""
from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

KEY = "dynjax_integrity"               # in orbax's step metadata (custom_metadata)
FILE = "dynjax_integrity.json"         # where older dynjax kept it, after orbax's commit
METADATA = "_CHECKPOINT_METADATA"      # orbax's step metadata file
UNVERIFIED = ("it has no readable digests (a save cut off before they were recorded, or a "
              "damaged _CHECKPOINT_METADATA), so a changed bit would go unnoticed")
_MIX = np.uint32(2654435761)   # Knuth's multiplicative constant (odd)


def _words(x) -> jax.Array:
    """The array's bits as a flat uint32 vector (8- and 16-bit types widened, 64-bit split)."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    x = jnp.ravel(x)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    size = x.dtype.itemsize
    if size == 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32)
    if size in (1, 2):
        unsigned = jnp.uint8 if size == 1 else jnp.uint16
        return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)
    return jnp.ravel(jax.lax.bitcast_convert_type(x, jnp.uint32))


def _leaf_digest(x):
    w = _words(x)
    weights = jnp.arange(w.size, dtype=jnp.uint32) * _MIX + jnp.uint32(1)
    finite = (jnp.all(jnp.isfinite(x)) if jnp.issubdtype(x.dtype, jnp.inexact)
              else jnp.bool_(True))
    return jnp.stack([jnp.sum(w, dtype=jnp.uint32), jnp.sum(w * weights, dtype=jnp.uint32),
                      finite.astype(jnp.uint32)])


@jax.jit
def _digests(tree):
    return jax.tree.map(_leaf_digest, tree)


def digest(tree) -> tuple[dict[str, str], list[str]]:
    """``({array path: 16 hex digits}, [paths of arrays with a non-finite entry])``."""
    sums, bad = {}, []
    for path, (s1, s2, finite) in jax.tree_util.tree_flatten_with_path(
            jax.device_get(_digests(tree)))[0]:
        key = jax.tree_util.keystr(path)
        sums[key] = f"{int(s1):08x}{int(s2):08x}"
        if not finite:
            bad.append(key)
    return sums, bad


def metadata(sums: dict[str, str]) -> dict:
    """The ``custom_metadata`` of orbax's save that records ``sums`` in the checkpoint."""
    return {KEY: {"version": 1, "arrays": sums}}


def recorded(step_dir) -> dict[str, str] | None:
    """The digests saved with a checkpoint (its step metadata, or an older dynjax's
    :data:`FILE`), or None if it has none that parse: then it cannot be verified."""
    step_dir = pathlib.Path(step_dir)
    for read in (lambda: json.loads((step_dir / METADATA).read_text())["custom_metadata"][KEY],
                 lambda: json.loads((step_dir / FILE).read_text())):
        try:
            arrays = read()["arrays"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(arrays, dict) and arrays:
            return arrays
    return None


def check(step_dir, tree) -> str | None:
    """Why ``tree`` (read from ``step_dir``) is not what was saved, or not finite; None if
    it is. Arrays of ``tree`` the record lacks are not compared (a partial read is fine)."""
    sums, bad = digest(tree)
    saved = recorded(step_dir)
    if saved is not None:
        wrong = [k for k, v in sums.items() if k in saved and saved[k] != v]
        if wrong:
            more = f" and {len(wrong) - 1} more" if len(wrong) > 1 else ""
            return (f"checksum mismatch in {wrong[0]}{more}: the files changed after the "
                    "save (a flipped bit, a bad copy)")
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        return f"non-finite values in {bad[0]}{more} (saved after training diverged)"
    return None
