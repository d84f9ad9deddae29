"""Frozen-Controller Audit interventions: pure functions of (coeffs, schema, key | calib),
plus, for the routing conditions (:data:`ROUTING`), the windows' token ids or the model's top-k.

Each reads only axis *names* from the schema (:mod:`dynjax.coeffs`), so one implementation
serves every family; all are jittable and vmappable over keys. The reassignment direction,
the key pairing that makes the 2x2 factorial paired, and where means come from:
docs/audit.md (Interventions: conventions).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dynjax.coeffs import Axes, Coeffs, Schema, axis_size, check, is_axes, map_with_axes

# Axes along which token_shuffle draws independent permutations (one per index).
TOKEN_SHUFFLE_INDEPENDENT = ("layer", "stream", "example")


# ----------------------------------------------------------------------------- primitives

def permute(coeffs: Coeffs, schema: Schema, axis: str, perm) -> Coeffs:
    """``out = take(c, perm, axis)`` in every leaf that has ``axis``; other leaves unchanged."""
    perm = jnp.asarray(perm)
    if perm.ndim != 1:
        raise ValueError(f"perm must be one-dimensional, got shape {perm.shape}")

    def one(a, axes: Axes):
        i = axes.index(axis)
        if i is None:
            return a
        if a.shape[i] != perm.shape[0]:
            raise ValueError(f"perm has length {perm.shape[0]} but axis {axis!r} of a "
                             f"coefficient of shape {a.shape} has size {a.shape[i]}")
        return jnp.take(a, perm, axis=i)

    return map_with_axes(one, coeffs, schema)


def _float_mean(x, axis):
    """Mean in at least float32 (bf16 sums lose too much), keepdims for broadcasting."""
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"a mean of coefficients needs a floating dtype, got {x.dtype}")
    return jnp.mean(x.astype(jnp.promote_types(x.dtype, jnp.float32)), axis=axis, keepdims=True)


def mean_over(coeffs: Coeffs, schema: Schema, over: Sequence[str], calib: Coeffs | None = None
              ) -> Coeffs:
    """Replace each leaf by its mean over the named axes ``over``, broadcast to its shape.

    The mean is taken over ``calib`` (same schema, any size along averaged axes) when given,
    else over ``coeffs``. Leaves lacking one of the axes simply skip it. Dtypes are kept.
    """
    over = tuple(over)
    source = coeffs if calib is None else calib
    if calib is not None:
        check(calib, schema)

    def one(axes: Axes, a, c):
        dims = tuple(axes.index(n) for n in over if n in axes)
        m = _float_mean(c, dims) if dims else c
        try:
            return jnp.broadcast_to(m, a.shape).astype(a.dtype)
        except ValueError:
            raise ValueError(f"calibration coefficient of shape {c.shape} (axes {axes.names}) "
                             f"cannot stand in for shape {a.shape} after averaging over {over}; "
                             "kept axes must have equal sizes") from None

    return jax.tree.map(one, schema, coeffs, source, is_leaf=is_axes)


# ------------------------------------------------------------------------------- samplers

def derangement(key, n: int):
    """A permutation of ``range(n)`` with no fixed point, uniform over all derangements.

    Rejection sampling of uniform permutations inside ``lax.while_loop`` (expected ~e draws,
    so cheap; jittable and vmappable). Exact uniformity makes every donor map equally
    likely, so each example's donor is uniform over the other n-1 examples.
    """
    n = int(n)
    if n < 2:
        raise ValueError(f"a derangement needs at least 2 examples, got n={n}: cross-input "
                         "reassignment is undefined for a single example")
    idx = jnp.arange(n)

    def body(state):
        k, _ = state
        k, sub = jax.random.split(k)
        return k, jax.random.permutation(sub, n)

    def has_fixed_point(state):
        return jnp.any(state[1] == idx)

    return jax.lax.while_loop(has_fixed_point, body, body((key, idx)))[1]


def token_permutations(key, n_tokens: int, shape: Sequence[int] = ()):
    """Independent uniform permutations of ``range(n_tokens)``, one per index of ``shape``.

    Returns int array ``shape + (n_tokens,)``. Uses ``jax.random.permutation`` per key, not
    an argsort of uniforms (ties among float32 uniforms would bias towards identity).
    """
    shape = tuple(int(s) for s in shape)
    count = 1
    for s in shape:
        count *= s
    keys = jax.random.split(key, count)
    perms = jax.vmap(lambda k: jax.random.permutation(k, n_tokens))(keys)
    return perms.reshape(shape + (n_tokens,))


def condition_keys(key):
    """``(k_donor, k_token)``: the one split every randomized condition uses (pairing)."""
    k_donor, k_token = jax.random.split(key)
    return k_donor, k_token


# ----------------------------------------------------------------------------- conditions

def correct(coeffs: Coeffs, schema: Schema, calib: Coeffs | None = None) -> Coeffs:
    """CC: the cached coefficients in their own coordinates."""
    return coeffs


def cross_input(coeffs: Coeffs, schema: Schema, key) -> Coeffs:
    """DC: one global derangement of examples, the same donor map for every leaf."""
    k_donor, _ = condition_keys(key)
    n = axis_size(coeffs, schema, "example")
    return permute(coeffs, schema, "example", derangement(k_donor, n))


def _shuffle_leaf(a, axes: Axes, key):
    """Permute ``token`` independently per index of the leaf's layer/stream/example axes.

    All other axes (source, unit, expert) move together with their token, so a token's
    coefficient vector stays whole and only its position changes.
    """
    t = axes.index("token")
    if t is None:
        return a
    batch = [axes.index(n) for n in axes.names if n in TOKEN_SHUFFLE_INDEPENDENT]
    front = batch + [t]
    x = jnp.moveaxis(a, front, list(range(len(front))))
    batch_shape, n_tok, rest = x.shape[:len(batch)], x.shape[len(batch)], x.shape[len(front):]
    perms = token_permutations(key, n_tok, batch_shape).reshape(-1, n_tok)
    flat = x.reshape((-1, n_tok) + rest)
    out = jax.vmap(lambda xb, pb: jnp.take(xb, pb, axis=0))(flat, perms)
    return jnp.moveaxis(out.reshape(x.shape), list(range(len(front))), front)


def _shuffle_groups(coeffs) -> list[int]:
    """One group id per leaf: leaves that differ only in their trailing dict keys (MoD's
    ``router`` and ``predictor``: two readings of the same tokens) share a group, and so a
    token permutation; entries of a per-layer list (MUDD) are separate groups."""
    groups, ids = {}, []
    for path, _ in jax.tree_util.tree_flatten_with_path(coeffs)[0]:
        path = list(path)
        while path and isinstance(path[-1], jax.tree_util.DictKey):
            path.pop()
        ids.append(groups.setdefault(jax.tree_util.keystr(tuple(path)), len(groups)))
    return ids


def token_shuffle(coeffs: Coeffs, schema: Schema, key) -> Coeffs:
    """CS: token positions permuted independently per (leaf group, layer, stream, example).

    Examples do *not* share a permutation: independent draws average the penalty over more
    orderings per reassignment. Values and support within each (layer, stream, example)
    are kept; only token alignment breaks. Each layer of a per-layer list gets its own key;
    sibling leaves of one dict share theirs, so same-shaped siblings move together.
    """
    _, k_token = condition_keys(key)
    leaves, treedef = jax.tree.flatten(coeffs)
    axes_list = jax.tree.leaves(schema, is_leaf=is_axes)
    check(coeffs, schema)
    out = [_shuffle_leaf(a, ax, jax.random.fold_in(k_token, g))
           for g, a, ax in zip(_shuffle_groups(coeffs), leaves, axes_list)]
    return jax.tree.unflatten(treedef, out)


def cross_shuffle(coeffs: Coeffs, schema: Schema, key) -> Coeffs:
    """DS: cross_input then token_shuffle, with the same donor map and perms as each alone."""
    return token_shuffle(cross_input(coeffs, schema, key), schema, key)


def layer_position_mean(coeffs: Coeffs, schema: Schema, calib: Coeffs | None = None) -> Coeffs:
    """Layer x PositionMean: mean over calibration examples; layer, stream, position, source kept."""
    return mean_over(coeffs, schema, ("example",), calib)


def static_profile(coeffs: Coeffs, schema: Schema, calib: Coeffs | None = None) -> Coeffs:
    """StaticProfile: mean over calibration examples and tokens (gates: LayerMean; MUDD: StaticMixMean)."""
    return mean_over(coeffs, schema, ("example", "token"), calib)


def structure_removed(coeffs: Coeffs, schema: Schema, calib: Coeffs | None = None) -> Coeffs:
    """StructureRemoved: SourceUniformMean for leaves with ``source``, GlobalMean for the rest.

    SourceUniformMean: per leaf, target layer and stream, every source gets the static
    profile's signed sum over sources divided by the number of sources (= its mean over
    example, token and source), so the signed sum per target layer and stream is kept.
    GlobalMean: one scalar for *all* leaves without ``source`` together, the element-weighted
    mean of their calibration values (mass-matched; a per-layer list of gate leaves shares
    it, so the depth profile is flattened, not kept).
    """
    source = coeffs if calib is None else calib
    if calib is not None:
        check(calib, schema)
    flat = [c for ax, c in zip(jax.tree.leaves(schema, is_leaf=is_axes), jax.tree.leaves(source))
            if "source" not in ax]
    if flat:
        total = sum(jnp.sum(_float_mean(c, None)) * c.size for c in flat)
        global_mean = total / sum(c.size for c in flat)

    def one(axes: Axes, a, c):
        if "source" in axes:
            dims = tuple(axes.index(n) for n in ("example", "token", "source") if n in axes)
            return jnp.broadcast_to(_float_mean(c, dims), a.shape).astype(a.dtype)
        return jnp.full(a.shape, global_mean, a.dtype)

    return jax.tree.map(one, schema, coeffs, source, is_leaf=is_axes)


# ------------------------------------------------------------------- routing conditions
# Three questions production routers raise (docs/audit_hf.md): is routing a lookup table of
# the token id, do expert identities matter (a control that must hurt), and do the mixing
# weights matter or only the choice of experts?

def same_token_donors(key, tokens):
    """``(N,)`` donors over the flattened (example, token) positions of ``tokens`` (W, T):
    each position's donor is a uniformly random *other* position holding the same token id;
    a position whose id occurs nowhere else is its own donor.

    Positions are sorted by (id, random tie-break) and each takes its successor within its
    id's run, cyclically: in a uniformly random cyclic order the successor is uniform over
    the other members. Fixed shapes, so it jits and vmaps over keys.
    """
    flat = jnp.asarray(tokens).reshape(-1)
    n = flat.shape[0]
    order = jnp.lexsort((jax.random.permutation(key, n), flat))
    ids = flat[order]
    idx = jnp.arange(n)
    starts = jnp.concatenate([jnp.ones((1,), bool), ids[1:] != ids[:-1]])
    first = jax.lax.cummax(jnp.where(starts, idx, 0))          # start of each id's run
    nxt = jnp.minimum(idx + 1, n - 1)
    succ = jnp.where((idx + 1 < n) & (ids[nxt] == ids), nxt, first)
    return jnp.zeros(n, order.dtype).at[order].set(order[succ])


def singleton_fraction(tokens) -> float:
    """Share of positions whose token id occurs nowhere else in ``tokens``: under
    token_identity they keep their own scores (the condition cannot move them)."""
    _, inverse, counts = np.unique(np.asarray(tokens).reshape(-1), return_inverse=True,
                                   return_counts=True)
    return float(np.mean(counts[inverse] == 1))


def token_identity(coeffs: Coeffs, schema: Schema, key, tokens) -> Coeffs:
    """TokenIdentity: each (example, token) position receives every coefficient recorded at
    another position holding the same token id (one donor map for every leaf and layer, so
    a token's whole routing comes from one other occurrence). If routing were a lookup
    table of the token id, this would cost nothing. Needs ``tokens``, the windows (W, T)."""
    donors = same_token_donors(jax.random.fold_in(key, 2), tokens)
    W, T = jnp.shape(tokens)

    def one(a, axes: Axes):
        e, t = axes.index("example"), axes.index("token")
        if e is None or t is None:
            return a
        x = jnp.moveaxis(a, (e, t), (0, 1))
        if x.shape[:2] != (W, T):
            raise ValueError(f"tokens have shape {(W, T)} but a coefficient's (example, token) "
                             f"axes have {x.shape[:2]}")
        y = jnp.take(x.reshape((W * T,) + x.shape[2:]), donors, axis=0).reshape(x.shape)
        return jnp.moveaxis(y, (0, 1), (e, t))

    return map_with_axes(one, coeffs, schema)


def expert_relabel(coeffs: Coeffs, schema: Schema, key) -> Coeffs:
    """ExpertRelabel: a fixed random derangement of the experts per layer (the same for every
    example and token): expert ``e`` receives the scores of expert ``perm[e]``. Routing keeps
    its statistics but sends tokens to experts that never learned them: a control that must
    hurt. Leaves without an ``expert`` axis are unchanged."""
    k = jax.random.fold_in(key, 3)

    def one(a, axes: Axes):
        x = axes.index("expert")
        if x is None:
            return a
        n_exp, layer = a.shape[x], axes.index("layer")
        if layer is None:
            return jnp.take(a, derangement(k, n_exp), axis=x)
        perms = jax.vmap(lambda kl: derangement(kl, n_exp))(jax.random.split(k, a.shape[layer]))
        b = jnp.moveaxis(a, (layer, x), (0, -1))
        b = jax.vmap(lambda row, perm: jnp.take(row, perm, axis=-1))(b, perms)
        return jnp.moveaxis(b, (0, -1), (layer, x))

    return map_with_axes(one, coeffs, schema)


def weights_flat(coeffs: Coeffs, schema: Schema, calib: Coeffs | None = None, *, top_k: int
                 ) -> Coeffs:
    """WeightsFlat: each token keeps its top-``top_k`` experts, with equal weights.

    On the ``expert`` axis the k chosen scores all become their mean and every other score
    0 (or the mean - 1 where the mean is not positive), so a replay that selects by top-k
    picks the same set, strictly, and weighs it equally: the mean itself where the router's
    scores are the weights (softmax then top-k, no renormalisation: their sum is kept), 1/k
    where the model renormalises the k weights. A model that selects on anything else
    (DeepSeek-V3 adds a bias for selection; group-limited top-k) keeps the set only while
    that bias spans less than the mean. ``calib`` is unused (a deterministic condition's
    signature)."""
    def one(a, axes: Axes):
        x = axes.index("expert")
        if x is None:
            return a
        b = jnp.moveaxis(a, x, -1)
        vals, idx = jax.lax.top_k(b, top_k)
        mean = jnp.mean(vals.astype(jnp.promote_types(b.dtype, jnp.float32)), -1, keepdims=True)
        chosen = jnp.sum(jax.nn.one_hot(idx, b.shape[-1], dtype=jnp.int32), -2) > 0
        low = jnp.where(mean > 0, 0.0, mean - 1.0)
        return jnp.moveaxis(jnp.where(chosen, mean, low).astype(a.dtype), -1, x)

    return map_with_axes(one, coeffs, schema)


@dataclasses.dataclass(frozen=True)
class Condition:
    """A registry entry. Randomized: ``fn(coeffs, schema, key)``; else ``fn(coeffs, schema, calib)``.
    ``label`` is its display name in tables and plots."""

    name: str
    label: str
    fn: Callable
    randomized: bool
    doc: str
    needs: tuple = ()       # keyword arguments beyond (coeffs, schema, key | calib):
                            # "tokens" (the windows) or a model fact such as "top_k"
    axes: tuple = ()        # axes a coefficient must have for the condition to apply

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


CONDITIONS: dict[str, Condition] = {c.name: c for c in (
    Condition("correct", "Correct", correct, False,
              "cached coefficients in their own coordinates (CC)"),
    Condition("cross_input", "Cross-input", cross_input, True,
              "global derangement across examples; multiset kept (DC)"),
    Condition("token_shuffle", "Token-shuffle", token_shuffle, True,
              "token positions permuted per layer, stream and example (CS)"),
    Condition("cross_shuffle", "Cross+shuffle", cross_shuffle, True,
              "cross_input and token_shuffle with paired draws (DS)"),
    Condition("layer_position_mean", "Layer×PositionMean", layer_position_mean, False,
              "mean over calibration examples; layer, stream, position, source kept"),
    Condition("static_profile", "StaticProfile", static_profile, False,
              "mean over calibration examples and positions (LayerMean / StaticMixMean)"),
    Condition("structure_removed", "StructureRemoved", structure_removed, False,
              "GlobalMean (one scalar) or SourceUniformMean (signed source sum kept)"),
)}


# Conditions for routers (an ``expert`` axis): not in the paper's protocol, so audits run
# them only when asked (configs/audit_hf.py); REGISTRY holds every condition by name.
ROUTING: dict[str, Condition] = {c.name: c for c in (
    Condition("token_identity", "Token-identity", token_identity, True,
              "each position gets the coefficients of another position with the same token id",
              needs=("tokens",), axes=("example", "token")),
    Condition("expert_relabel", "Expert-relabel", expert_relabel, True,
              "a random derangement of the experts per layer (a control that must hurt)",
              axes=("expert",)),
    Condition("weights_flat", "Weights-flat", weights_flat, False,
              "each token's top-k experts kept, with equal weights", needs=("top_k",),
              axes=("expert",)),
)}


def recent_keys(coeffs: Coeffs, schema: Schema, calib: Coeffs | None = None) -> Coeffs:
    """Indexer leaves (a ``key`` axis): every query's scores become the key's index, so the
    causal top-k the model recomputes keeps its k most recent visible keys: the same number
    of keys, chosen by position only (the indexers' static control). Other leaves kept."""
    def one(a, axes: Axes):
        if "key" not in axes:
            return a
        shape = [1] * a.ndim
        shape[axes.index("key")] = a.shape[axes.index("key")]
        return jnp.broadcast_to(jnp.arange(shape[axes.index("key")], dtype=a.dtype)
                                .reshape(shape), a.shape)
    return map_with_axes(one, coeffs, schema)


# Conditions for learned token selection (a ``key`` axis: DeepSeek-V3.2/V4, GLM-5 indexers).
SELECTION: dict[str, Condition] = {c.name: c for c in (
    Condition("recent_keys", "Recent-keys", recent_keys, False,
              "each query keeps its k most recent visible keys (position only)",
              axes=("key",)),
)}
REGISTRY: dict[str, Condition] = {**CONDITIONS, **ROUTING, **SELECTION}


def apply_condition(name: str, coeffs: Coeffs, schema: Schema, *, key=None,
                    calib: Coeffs | None = None, **needs) -> Coeffs:
    """Call registry entry ``name`` with the argument its kind needs (key or calib) and
    what it ``needs`` (tokens, top_k)."""
    cond = REGISTRY[name]
    missing = [n for n in cond.needs if n not in needs]
    if missing:
        raise ValueError(f"condition {name!r} needs {missing}")
    extra = {n: needs[n] for n in cond.needs}
    if cond.randomized:
        if key is None:
            raise ValueError(f"condition {name!r} is randomized and needs a key")
        return cond.fn(coeffs, schema, key, **extra)
    return cond.fn(coeffs, schema, calib, **extra)
