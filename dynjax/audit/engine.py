"""The Frozen-Controller Audit engine: record, exact replay, the forwards of every condition.

Family-agnostic: it needs only ``apply_fn(params, inputs, coeffs=None) -> (logits, coeffs)``
(:mod:`dynjax.coeffs`), the coefficient schema and a :class:`~dynjax.tasks.Task`.
Three compiled programs per model and shape do the work: the model's jitted apply (record
and replay, one program that a :class:`~dynjax.coeffs.Given`'s flag switches), ``reassign``
(the whole cached evaluation set -> R reassigned copies, so a derangement is global, never
per batch) and ``take`` (one batch of (reassignment, window) rows). Every NLL, Correct
included, comes from the replay program, so a condition that changes nothing gives ΔNLL = 0
bit for bit.
"""
from __future__ import annotations

import collections
import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from dynjax import coeffs as coeffs_lib
from dynjax.audit import families as families_lib
from dynjax.audit import interventions
from dynjax.audit.settings import Settings, n_windows
from dynjax.audit.placement import Placement
from dynjax.coeffs import is_axes
from dynjax.errors import AuditError
from dynjax.tasks import LM, Task


def _rows(windows, idx):
    """Rows ``idx`` (a slice or an index array) of every leaf."""
    return jax.tree.map(lambda a: a[idx], windows)


def _chunks(n: int, rows: int):
    """``(start, keep)``: fixed-size chunks ``[start, start + rows)`` that cover ``range(n)``.

    Every chunk has the compiled shape; the last is shifted back to end at ``n`` and its first
    ``keep`` rows, already done by the chunk before, are discarded.
    """
    out, done = [], 0
    while done < n:
        start = min(done, n - rows)
        out.append((start, done - start))
        done = start + rows
    return out


@dataclasses.dataclass
class Recording:
    """Coefficients of a window set (device pytree, example axis = window) and its NLLs."""

    coeffs: object
    nll_record: np.ndarray            # (W,) float32, per-window loss (the Task's)
    nll_replay: np.ndarray | None     # (W,) from replaying the cached coefficients
    max_abs_dlogit: float | None


def schema_signature(schema) -> str:
    return str(jax.tree.structure(schema, is_leaf=is_axes)) + repr(
        [ax.names for ax in jax.tree.leaves(schema, is_leaf=is_axes)])


class CoeffPrograms:
    """The model-independent programs over coefficient pytrees of one schema.

    Shared by every model with that schema (see :func:`coeff_programs`), so the reassignment
    programs, the slowest to compile, compile once per process and shape.
    """

    def __init__(self, schema):
        self.schema = schema

        def take(stack, r_idx, w_idx):
            """Rows j = coefficient set ``r_idx[j]`` of window ``w_idx[j]``, from (R_c, ...)."""
            def one(axes, a):
                i = axes.index("example") + 1
                x = jnp.moveaxis(a, i, 1)[r_idx, w_idx]
                return jnp.moveaxis(x, 0, i - 1)
            return jax.tree.map(one, schema, stack, is_leaf=is_axes)

        def take_cached(cache, w_idx):
            stack = jax.tree.map(lambda a: a[None], cache)
            return take(stack, jnp.zeros_like(w_idx), w_idx)

        def write(cache, chunk, start, keep):
            """Write a chunk's rows ``keep:`` into the cache at windows ``start + keep:``."""
            def one(axes, c, x):
                i = axes.index("example")
                old = jax.lax.dynamic_slice_in_dim(c, start, x.shape[i], axis=i)
                shape = [1] * x.ndim
                shape[i] = x.shape[i]
                mask = (jnp.arange(x.shape[i]) >= keep).reshape(shape)
                return jax.lax.dynamic_update_slice_in_dim(c, jnp.where(mask, x, old), start, i)
            return jax.tree.map(one, schema, cache, chunk, is_leaf=is_axes)

        self._take_cached_py = take_cached
        self.take = jax.jit(take)
        self.take_cached = jax.jit(take_cached)
        self.write = jax.jit(write, donate_argnums=0)
        self._reassign: dict[tuple, Callable] = {}
        self._transform: dict[tuple, Callable] = {}

    def reassign(self, names: tuple[str, ...], facts: tuple = (), only: tuple | None = None
                 ) -> Callable:
        """``(cache, keys, tokens) -> tuple of (R_c, ...) stacks``, one per randomized
        condition (``tokens``: the windows, for conditions that need them, else None).

        One vmapped, jitted program over keys for the whole group: the conditions see the same
        key per reassignment (paired, as the 2x2 factorial needs) and XLA shares the donor maps
        and token permutations they have in common. Each applies to the *whole* cache, so a
        derangement is global over every evaluation window. ``facts``: the model's
        ``((name, value), ...)`` that conditions need (e.g. top_k). ``only``: the top-level
        coefficient keys of one family (:mod:`dynjax.audit.families`): the conditions act
        on those leaves, the others stay as recorded; None: on every leaf.
        """
        if (names, facts, only) not in self._reassign:
            conds = [interventions.REGISTRY[n] for n in names]
            fns = [families_lib.restrict(c.fn, only) for c in conds]
            self._reassign[names, facts, only] = jax.jit(jax.vmap(
                lambda cache, key, tokens: tuple(
                    fn(cache, self.schema, key, **_needs(c, facts, tokens))
                    for c, fn in zip(conds, fns)),
                in_axes=(None, 0, None)))
        return self._reassign[names, facts, only]

    def transform(self, name: str, facts: tuple = (), only: tuple | None = None) -> Callable:
        """``(cache, calib, w_idx) -> rows``: a deterministic condition on one batch of rows
        (its means come from ``calib``, so the rows alone determine its output); ``only`` as
        in :meth:`reassign`."""
        if (name, facts, only) not in self._transform:
            cond = interventions.REGISTRY[name]
            fn = families_lib.restrict(cond.fn, only)
            self._transform[name, facts, only] = jax.jit(
                lambda cache, calib, w_idx: fn(self._take_cached_py(cache, w_idx),
                                               self.schema, calib,
                                               **_needs(cond, facts, None)))
        return self._transform[name, facts, only]


def _needs(cond, facts: tuple, tokens) -> dict:
    """The keyword arguments ``cond`` needs: the windows' tokens, or model facts."""
    facts = dict(facts)
    return {n: tokens if n == "tokens" else facts[n] for n in cond.needs}


_PROGRAMS: dict[str, CoeffPrograms] = {}


def coeff_programs(schema) -> CoeffPrograms:
    key = schema_signature(schema)
    if key not in _PROGRAMS:
        _PROGRAMS[key] = CoeffPrograms(schema)
    return _PROGRAMS[key]


def _max_abs_diff(a, b, keep):
    """max |a - b| over rows ``keep:`` (the rest belong to the previous chunk); NaN if either
    side has a NaN there (a NaN is never an exact replay)."""
    rows = (jnp.arange(a.shape[0]) >= keep).reshape((-1,) + (1,) * (a.ndim - 1))
    return jnp.max(jnp.where(~rows | (a == b), 0.0, jnp.abs(a - b)))


def keys_per_chunk(R: int, group_bytes: int, budget: int) -> int:
    """Reassignments materialised at once: as many as ``budget`` bytes allow, in even chunks
    (fewer distinct shapes to compile)."""
    per = max(1, min(R, int(budget // max(group_bytes, 1))))
    return -(-R // -(-R // per))


def _gather(parts):
    """Concatenate per-chunk device results, dropping each chunk's ``keep`` repeated rows."""
    return np.concatenate([np.asarray(a)[k:] for a, k in jax.device_get(parts)])


class Engine:
    """The audit of one model (apply_fn, schema) at ``rows`` rows per forward pass.

    ``window``: one window's shape, an int (a language model's seq_len, int32 tokens) or a
    pytree of ShapeDtypeStructs (:func:`window_spec`); ``task``: the loss hook (:data:`LM`,
    :data:`CLASSIFY`). ``forward`` (the jitted ``apply_fn``, record and replay) is this
    model's only compiled forward; everything else runs in :class:`CoeffPrograms`.
    ``placement`` (:class:`~dynjax.audit.placement.Placement`) runs it under a device mesh:
    rows split over the data-parallel axes, parameters as :meth:`place_params` puts them.
    ``forwards`` counts the forward calls made (by program).
    """

    def __init__(self, apply_fn: Callable, schema, rows: int, window, task: Task = LM,
                 placement: Placement | None = None, facts: dict | None = None):
        leaves = jax.tree.leaves(schema, is_leaf=is_axes)
        if not leaves:
            raise AuditError("the model records no coefficients (empty schema), so there is "
                             "nothing to audit; audit a model with a controller (e.g. the "
                             "uniform, layer_static or feature_gate variants, or MUDDPythia)")
        missing = [ax.names for ax in leaves if "example" not in ax]
        if missing:
            raise AuditError(f"coefficient leaves with axes {missing} lack an 'example' axis; "
                             "the audit batches and reassigns windows along it")
        self.apply_fn, self.schema = apply_fn, schema
        self.facts = tuple(sorted((facts or {}).items()))   # e.g. top_k, for weights_flat
        if isinstance(window, (int, np.integer)):
            window = jax.ShapeDtypeStruct((int(window),), jnp.int32)
        self.rows, self.window, self.task = int(rows), window, task
        self.programs = coeff_programs(schema)
        self.forwards = collections.Counter()
        self.place = Placement() if placement is None else placement
        self.place.check_rows(self.rows)

        # The model's own apply, jitted as is, serves both modes as one program: record and
        # replay differ only in the Given's arrays (see dynjax.coeffs.site). The loss is a
        # separate program on the logits, so the forward is the model's alone.
        self.forward = jax.jit(apply_fn)
        self._nll = self.place.jit_to_host(task.loss)
        self._max_abs_diff = self.place.jit_to_host(_max_abs_diff)
        self._replicate = self.place.jit_to_host(lambda tree: tree)
        self._zeros = None  # the record's Given values: zeros shaped like one batch's coeffs

    def place_params(self, params, logical_axes: Callable | None = None):
        """``params`` where this engine's forward wants them: by the placement's rules from
        ``logical_axes(inputs)`` (the model's logical specs of its parameters; None:
        replicated)."""
        specs = None
        if logical_axes is not None and self.place.mesh is not None:
            one = jax.tree.map(lambda s: np.zeros((1,) + s.shape, s.dtype), self.window)
            specs = logical_axes(self.task.inputs(one))
        return self.place.params(params, specs)

    def to_host(self, tree):
        """A device pytree as NumPy, on every process (replicated first under a mesh)."""
        return jax.device_get(tree if self.place.mesh is None else self._replicate(tree))

    def record_fn(self, params, batch):
        """``(per-window loss, logits, coeffs)``: the controller's values are used."""
        batch = self.place.batch(batch)
        if self._zeros is None:
            self._zeros = self.place.coeffs(
                self.schema, coeffs_lib.zeros_like(self.coeff_shapes(params)))
        logits, coeffs = self.forward(params, self.task.inputs(batch),
                                      coeffs_lib.Given(self._zeros, self.place.flag(False)))
        return self._nll(logits, batch), logits, coeffs

    def replay_fn(self, params, batch, coeffs):
        """``(per-window loss, logits)`` with ``coeffs`` used verbatim (the same program:
        under a mesh, the coefficients get the record's input shardings first)."""
        batch = self.place.batch(batch)
        given = coeffs_lib.Given(self.place.coeffs(self.schema, coeffs), self.place.flag(True))
        logits, _ = self.forward(params, self.task.inputs(batch), given)
        return self._nll(logits, batch), logits

    def _chunks(self, n: int):
        if n < self.rows:
            raise AuditError(f"{n} windows is fewer than the batch of {self.rows} rows; "
                             "lower batch_size or use more windows")
        return _chunks(n, self.rows)

    def coeff_shapes(self, params):
        """ShapeDtypeStructs of one batch's recorded coefficients (nothing runs)."""
        batch = jax.tree.map(lambda s: jax.ShapeDtypeStruct((self.rows,) + s.shape, s.dtype),
                             self.window)
        return jax.eval_shape(lambda p, b: self.apply_fn(p, self.task.inputs(b))[1],
                              params, batch)

    def cache_bytes(self, params, n_windows: int) -> int:
        per_row = sum(math.prod(s.shape) * s.dtype.itemsize
                      for s in jax.tree.leaves(self.coeff_shapes(params))) // self.rows
        return int(per_row * n_windows)

    # -- record and exact replay
    def record(self, params, windows, check: bool = True, bar=None) -> Recording:
        """Record every window's coefficients (batched, jitted) into one device cache; with
        ``check``, replay each batch from the cache and compare logits with the record."""
        windows = self.task.prepare(windows)
        W = n_windows(windows)
        chunks = self._chunks(W)
        shapes = self.coeff_shapes(params)
        try:
            coeffs_lib.check(shapes, self.schema)
        except ValueError as e:
            raise AuditError(f"the model's recorded coefficients do not match its schema: "
                             f"{e}") from None

        def full(axes, s):
            shape = list(s.shape)
            shape[axes.index("example")] = W
            return jnp.zeros(shape, s.dtype)
        zeros = lambda: jax.tree.map(full, self.schema, shapes, is_leaf=is_axes)
        cache = zeros() if self.place.mesh is None else jax.jit(
            zeros, out_shardings=self.place.coeff_shardings(self.schema, W))()

        P = self.programs
        nll_rec, nll_rep, diffs = [], [], []
        for start, keep in chunks:
            w_idx = np.arange(start, start + self.rows, dtype=np.int32)
            batch = _rows(windows, slice(start, start + self.rows))
            nll, logits, chunk = self.record_fn(params, batch)
            self.forwards["record"] += 1
            cache = P.write(cache, chunk, start, keep)
            nll_rec.append((nll, keep))
            if check:  # replay what the cache now holds (the given values decide)
                nll2, logits2 = self.replay_fn(params, batch, P.take_cached(cache, w_idx))
                self.forwards["replay"] += 1
                nll_rep.append((nll2, keep))
                diffs.append(self._max_abs_diff(logits, logits2, keep))
            if bar is not None:
                bar.update(1 + check)
        cache = self.place.coeffs(self.schema, cache)   # the canonical sharding (a no-op
        if not check:                                   # without a mesh)
            return Recording(cache, _gather(nll_rec), None, None)
        d = np.asarray(jax.device_get(diffs), np.float64)
        max_d = float(np.nan if np.isnan(d).any() else d.max())
        return Recording(cache, _gather(nll_rec), _gather(nll_rep), max_d)

    # -- conditions
    def transform(self, name: str, only: tuple | None = None) -> Callable:
        """The deterministic condition ``name``'s program, with this model's facts, on the
        family ``only`` (top-level coefficient keys; None: every leaf)."""
        return self.programs.transform(name, self.facts, only)

    def deterministic_nll(self, name: str, params, windows, rec: Recording, calib, bar=None,
                          only: tuple | None = None):
        """(W,) loss under a deterministic condition (means over ``calib``), batch by batch."""
        windows = self.task.prepare(windows)
        fn, parts = self.transform(name, only), []
        for start, keep in self._chunks(n_windows(windows)):
            w_idx = np.arange(start, start + self.rows, dtype=np.int32)
            nll, _ = self.replay_fn(params, _rows(windows, slice(start, start + self.rows)),
                                    fn(rec.coeffs, calib, w_idx))
            self.forwards["replay"] += 1
            parts.append((nll, keep))
            if bar is not None:
                bar.update(1)
        return _gather(parts)

    def randomized_nll(self, names: tuple[str, ...], params, windows, rec: Recording, keys,
                       max_reassign_bytes: int, bar=None, only: tuple | None = None) -> dict:
        """{name: (R, W) loss} for a group of randomized conditions sharing the R keys.

        Per chunk of keys, one vmapped program reassigns the whole cache for every condition;
        then (reassignment, window) pairs are flattened into fixed-size batches and replayed.
        ``only``: the family the conditions act on (top-level coefficient keys; None: all).
        """
        windows = self.task.prepare(windows)
        W, R = n_windows(windows), int(keys.shape[0])
        cache_bytes = sum(a.nbytes for a in jax.tree.leaves(rec.coeffs))
        per = keys_per_chunk(R, cache_bytes * len(names), max_reassign_bytes)
        out = {n: np.empty((R, W), np.float32) for n in names}
        reassign = self.programs.reassign(names, self.facts, only)
        tokens = windows if any("tokens" in interventions.REGISTRY[n].needs
                                for n in names) else None
        for k0 in range(0, R, per):
            kc = keys[k0:k0 + per]
            n_keys = int(kc.shape[0])
            stacks = reassign(rec.coeffs, kc, tokens)
            parts = {n: [] for n in names}
            for start, keep in self._chunks(n_keys * W):
                p = np.arange(start, start + self.rows)
                r_idx, w_idx = (p // W).astype(np.int32), (p % W).astype(np.int32)
                batch = self.place.batch(_rows(windows, p % W))
                for name, stack in zip(names, stacks):
                    rows = self.programs.take(stack, r_idx, w_idx)
                    nll, _ = self.replay_fn(params, batch, rows)
                    self.forwards["replay"] += 1
                    parts[name].append((nll, keep))
                    if bar is not None:
                        bar.update(1)
            for name in names:
                out[name][k0:k0 + n_keys] = _gather(parts[name]).reshape(n_keys, W)
            del stacks
        return out

    def forward_count(self, n_eval: int, n_calib: int, settings: Settings,
                      cache_bytes: int, family_settings=()) -> int:
        """Forward calls one checkpoint's audit makes (the progress bar's total);
        ``family_settings``: the Settings of each family audited apart, whose conditions
        replay the same recording."""
        n = lambda m: len(_chunks(m, self.rows))
        total = 2 * n(n_eval) + n(n_calib)
        for s in (settings, *family_settings):
            names = [c for c in s.conditions if c != "correct"]
            group = [c for c in names if interventions.REGISTRY[c].randomized]
            total += n(n_eval) * (len(names) - len(group))
            if group:
                R = s.reassignments
                per = keys_per_chunk(R, cache_bytes * len(group), s.max_reassign_bytes)
                total += len(group) * sum(n(min(per, R - k0) * n_eval)
                                          for k0 in range(0, R, per))
        return total
