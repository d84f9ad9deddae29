"""Is a checkpoint what was saved, and is it finite? Per-array digests, computed where the
array lives (NumPy for arrays in host memory, a jitted program for the others).

Each save records every array's digest in orbax's step metadata (committed with the
checkpoint); every restore recomputes and compares, so a flipped bit orbax reads without
complaint is caught. The digest is two position-weighted integer sums of the array's
32-bit words (exact in any order: the same on any mesh); the same pass says whether every
entry is finite. How it is computed and the unverified case: docs/reliability.md.
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
_CHUNK = 1 << 22               # words NumPy sums at a time


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


def _in_host_memory(x) -> bool:
    """Whether NumPy can read ``x`` where it is: a NumPy array, or a JAX array held whole by
    this process on CPU devices (at most 32-bit words: JAX's own 64-bit types stay on the
    device path)."""
    if isinstance(x, np.ndarray):
        return x.dtype.itemsize <= 4
    return (isinstance(x, jax.Array) and x.is_fully_addressable
            and all(d.platform == "cpu" for d in x.devices())
            and (jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) or x.dtype.itemsize <= 4))


def _host_digest(x) -> tuple:
    """:func:`_leaf_digest` in NumPy, bit for bit (uint32 arithmetic wraps the same way)."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    x = np.ravel(np.asarray(x))
    w = x.view(np.uint8 if x.dtype == np.bool_ else {1: np.uint8, 2: np.uint16,
                                                    4: np.uint32}[x.dtype.itemsize])
    s1 = s2 = 0
    for start in range(0, w.size, _CHUNK):   # temporaries of one chunk, not of the array
        part = w[start:start + _CHUNK].astype(np.uint32)
        weights = np.arange(start, start + part.size, dtype=np.uint32) * _MIX + np.uint32(1)
        s1 = (s1 + int(np.sum(part, dtype=np.uint32))) % 2**32
        s2 = (s2 + int(np.sum(part * weights, dtype=np.uint32))) % 2**32
    finite = bool(np.all(np.isfinite(x))) if jnp.issubdtype(x.dtype, jnp.inexact) else True
    return s1, s2, finite


def digest(tree) -> tuple[dict[str, str], list[str]]:
    """``({array path: 16 hex digits}, [paths of arrays with a non-finite entry])``. Arrays
    already in host memory (every array on the CPU backend) are summed by NumPy where they
    lie; the others by one jitted program, on their devices."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    host = [_in_host_memory(x) for _, x in flat]
    elsewhere = [x for (_, x), h in zip(flat, host) if not h]
    on_device = iter(jax.device_get(_digests(elsewhere)) if elsewhere else ())
    sums, bad = {}, []
    for (path, x), h in zip(flat, host):
        s1, s2, finite = _host_digest(x) if h else next(on_device)
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
