"""Weight sparsity as optax wrappers: RigL dynamic sparse training and static magnitude pruning.

Both wrap an inner optimizer because RigL must see the raw dense gradient to regrow while
the inner optimizer sees only present weights' gradients. :class:`SparseState`'s ``masks``
are the one truth of which weights exist; every update re-applies them, so masked weights
are exactly 0.0 and the non-zero count is exact. The RigL schedule (ERK densities, cosine
drop fraction) and pruning rule: docs/training.md.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax


class SparseState(NamedTuple):
    inner: Any
    masks: Any
    count: jnp.ndarray


def backbone_kernels(path, leaf) -> bool:
    """Default filter: 2-D kernels of the MLP's layers, not of GateNets or routers."""
    names = [str(getattr(k, "key", k)) for k in path]
    return leaf.ndim == 2 and names[-1] == "kernel" and not {"gate", "router"} & set(names)


def _selected(params, select):
    return jax.tree_util.tree_map_with_path(lambda p, x: bool(select(p, x)), params)


def erk_densities(shapes, sparsity: float) -> list[float]:
    """ERK densities for 2-D ``shapes`` with overall density 1 - sparsity (exact in expectation)."""
    if not 0 <= sparsity < 1:
        raise ValueError(f"sparsity={sparsity} must lie in [0, 1)")
    sizes = np.array([a * b for a, b in shapes], np.float64)
    raw = np.array([(a + b) / (a * b) for a, b in shapes], np.float64)
    dense = np.zeros(len(shapes), bool)
    target = (1 - sparsity) * sizes.sum()
    while True:
        budget = target - sizes[dense].sum()
        eps = budget / (raw[~dense] * sizes[~dense]).sum()
        dens = np.where(dense, 1.0, eps * raw)
        if (dens <= 1).all():
            return dens.tolist()
        dense |= dens > 1


def _rank_desc(scores):
    """rank[i] = position of scores[i] in descending order (0 = largest); ties by index."""
    order = jnp.argsort(-scores, stable=True)
    return jnp.zeros(scores.shape, jnp.int32).at[order].set(jnp.arange(scores.size, dtype=jnp.int32))


def _apply_masks(inner: optax.GradientTransformation, grads, state, params, masks):
    """Inner update on masked gradients, then updates that land params on the mask
    (absent weights exactly 0; newly present weights start at 0)."""
    grads = jax.tree.map(lambda g, m: jnp.where(m, g, 0), grads, masks)
    updates, inner_state = inner.update(grads, state.inner, params)
    new = jax.tree.map(lambda p, u, m, m0: jnp.where(m & m0, p + u, 0).astype(p.dtype),
                       params, updates, masks, state.masks)
    return jax.tree.map(lambda n, p: n - p, new, params), inner_state


def rigl(inner: optax.GradientTransformation, sparsity: float, update_every: int = 100,
         drop_fraction: float = 0.3, end_step: int = 10_000, seed: int = 0,
         select: Callable = backbone_kernels) -> optax.GradientTransformation:
    if update_every <= 0 or end_step <= 0:
        raise ValueError("rigl: update_every and end_step must be positive")
    if not 0 <= drop_fraction <= 1:
        raise ValueError(f"rigl: drop_fraction={drop_fraction} must lie in [0, 1]")

    def init(params):
        sel = _selected(params, select)
        leaves, treedef = jax.tree.flatten(params)
        chosen = [i for i, s in enumerate(jax.tree.leaves(sel)) if s]
        if not chosen:
            raise ValueError("rigl: the select filter matched no parameter")
        dens = dict(zip(chosen, erk_densities([leaves[i].shape for i in chosen], sparsity)))
        rng = np.random.default_rng(seed)
        masks = []
        for i, x in enumerate(leaves):
            if i not in dens:
                masks.append(jnp.ones(x.shape, bool))
                continue
            k = round(dens[i] * x.size)
            flat = np.zeros(x.size, bool)
            flat[rng.permutation(x.size)[:k]] = True
            masks.append(jnp.asarray(flat.reshape(x.shape)))
        masks = jax.tree.unflatten(treedef, masks)
        return SparseState(inner.init(params), masks, jnp.zeros((), jnp.int32))

    def regrow(masks, params, grads, frac):
        def one(m, w, g):
            flat_m, flat_w, flat_g = m.reshape(-1), w.reshape(-1), g.reshape(-1)
            k = jnp.sum(flat_m)
            d = jnp.floor(frac * k).astype(jnp.int32)
            keep = flat_m & (_rank_desc(jnp.where(flat_m, jnp.abs(flat_w), -jnp.inf)) < k - d)
            grow = ~keep & (_rank_desc(jnp.where(keep, -jnp.inf, jnp.abs(flat_g))) < d)
            return (keep | grow).reshape(m.shape)
        sel = _selected(params, select)
        return jax.tree.map(lambda m, w, g, s: one(m, w, g) if s else m, masks, params, grads,
                            sel)

    def update(grads, state, params):
        if params is None:
            raise ValueError("rigl needs params: call tx.update(grads, state, params)")
        t = state.count
        frac = drop_fraction * 0.5 * (1 + jnp.cos(jnp.pi * jnp.minimum(t, end_step) / end_step))
        due = (t > 0) & (t % update_every == 0) & (t < end_step)
        # Drop by the magnitude of the current weights, regrow by the dense gradient.
        masks = jax.lax.cond(due, lambda: regrow(state.masks, params, grads, frac),
                             lambda: state.masks)
        updates, inner_state = _apply_masks(inner, grads, state, params, masks)
        return updates, SparseState(inner_state, masks, t + 1)

    return optax.GradientTransformation(init, update)


def magnitude_prune(inner: optax.GradientTransformation, density: float, prune_step: int,
                    select: Callable = backbone_kernels) -> optax.GradientTransformation:
    """Dense until ``prune_step``, then the top ``density`` fraction by magnitude per matrix."""
    if not 0 < density <= 1:
        raise ValueError(f"prune density={density} must lie in (0, 1]")

    def init(params):
        return SparseState(inner.init(params), jax.tree.map(lambda x: jnp.ones(x.shape, bool),
                                                            params), jnp.zeros((), jnp.int32))

    def prune(masks, params):
        sel = jax.tree.leaves(_selected(params, select))
        flat_m, treedef = jax.tree.flatten(masks)
        out = []
        for m, w, s in zip(flat_m, jax.tree.leaves(params), sel):
            if not s:
                out.append(m)
                continue
            k = round(density * w.size)
            out.append((_rank_desc(jnp.abs(w).reshape(-1)) < k).reshape(w.shape))
        return jax.tree.unflatten(treedef, out)

    def update(grads, state, params):
        if params is None:
            raise ValueError("magnitude_prune needs params")
        masks = jax.lax.cond(state.count == prune_step, lambda: prune(state.masks, params),
                             lambda: state.masks)
        updates, inner_state = _apply_masks(inner, grads, state, params, masks)
        return updates, SparseState(inner_state, masks, state.count + 1)

    return optax.GradientTransformation(init, update)


def weight_masks(opt_state, params, names):
    """The 2-D masks of the matrices ``names`` (e.g. layer_0, ..., out), or None if dense."""
    if not isinstance(opt_state, SparseState):
        return None
    return [opt_state.masks[n]["dense"]["kernel"] if "dense" in opt_state.masks[n]
            else opt_state.masks[n]["kernel"] for n in names]

