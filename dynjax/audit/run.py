"""The Frozen-Controller Audit engine: record, exact replay, every condition, statistics.

Family-agnostic: it needs only ``apply_fn(params, inputs, coeffs=None) -> (logits, coeffs)``
(record when ``coeffs`` is None, replay otherwise), the coefficient schema and a
:class:`Task` (the per-window loss hook), so residual gates, MUDD, MoD / MoE / MoDE routing,
DynamicGate-MLP classifiers and any later family audit through the same code::

    engine = Engine(model.apply, model.schema, rows=64, window=128)   # LM: 128-token windows
    ckpt = audit_checkpoint(engine, params, calib_tokens, eval_tokens, Settings())
    sections = summarize([ckpt, ...], Settings(), model.schema)  # conditions, effects

``audit_targets`` does that for several checkpoints and returns the full results dict
(report.write_report's format); ``audit_from_config`` is the whole audit.py program
(run directories or a MUDDPythia directory in, report out).

A *window* is one unit of evaluation: a token window of a language model (loss: mean
next-token NLL), or one labelled example of a classifier (loss: cross-entropy of its label).
Windows are a pytree of arrays with a leading window axis; calibration windows come from
the validation split, evaluation windows from the test split.

Three kinds of compiled program do all the work (each compiled once per model and shape):

- ``forward``  the model's jitted apply: rows of windows -> logits, coefficients (record,
               the controller runs), or rows + coefficients -> logits (replay, it does not);
               the per-window NLL is a small separate program on the logits;
- ``reassign`` the *whole* cached evaluation set -> R_c reassigned copies for every
               randomized condition at once, vmapped over keys, so a derangement is global
               over all evaluation windows, never per batch;
- ``take``     one batch of rows out of those copies: (reassignment, window) pairs flattened
               into the batch, so the R reassignments run as ordinary batched forwards.

Every NLL, Correct included, comes from the one compiled replay program, so a condition
that leaves the coefficients unchanged gives ΔNLL = 0 bit for bit. The replay of the cached
coefficients is checked against the record, bitwise by default, before any intervention:
no intervention result is valid without it.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import math
import pathlib
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dynjax import coeffs as coeffs_lib
from dynjax.audit import interventions, stats, variance
from dynjax.audit.report import LABELS
from dynjax.coeffs import is_axes
from dynjax.models.transformer import next_token_nll

RANDOMIZED_2X2 = ("cross_input", "token_shuffle", "cross_shuffle")
EFFECTS = ("E_input", "E_token", "E_interaction")

# Conditions that act on the ``token`` axis. Without one (a classifier's unit gates) they
# would only repeat another condition bit for bit (token_shuffle = correct, cross_shuffle =
# cross_input, layer_position_mean = static_profile) and the factorial effects would be
# zeros by construction, so they are skipped and reported as not applicable instead.
TOKEN_CONDITIONS = {
    "token_shuffle": "no coefficient has a token axis: it would equal Correct",
    "cross_shuffle": "no coefficient has a token axis: it would equal Cross-input",
    "layer_position_mean": "no coefficient has a token axis: it would equal the static "
                           "profile (LayerMean)",
}


class AuditError(ValueError):
    """Bad input to the audit; the message names the fix."""


class ReplayError(RuntimeError):
    """Replay of the cached coefficients did not reproduce the record."""


# --------------------------------------------------------------------- the loss hook

@dataclasses.dataclass(frozen=True)
class Task:
    """The per-window loss hook: what a window is and how the fixed model is scored on it.

    ``prepare`` casts a host pytree of windows (leading window axis) to its dtypes,
    ``inputs(batch)`` is what the model's apply gets and ``loss(logits, batch)`` the
    per-window loss (rows,) in nats. It runs as its own small program on the logits, never
    inside the model's forward (that could change XLA's fusion and break bitwise replay).
    """

    name: str
    prepare: Callable
    inputs: Callable
    loss: Callable
    description: str


def _next_token_loss(logits, tokens):
    return next_token_nll(logits, tokens).mean(axis=-1)


def _label_loss(logits, batch):
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, batch["y"][:, None], axis=-1)[:, 0]


LM = Task("next_token", lambda w: np.asarray(w, np.int32), lambda b: b, _next_token_loss,
          "mean next-token NLL of a token window (nats)")
CLASSIFY = Task("classification",
                lambda w: {"x": np.asarray(w["x"], np.float32), "y": np.asarray(w["y"], np.int32)},
                lambda b: b["x"], _label_loss,
                "cross-entropy of an example's label (nats); a window is one example")


def n_windows(windows) -> int:
    return int(jax.tree.leaves(windows)[0].shape[0])


def _rows(windows, idx):
    """Rows ``idx`` (a slice or an index array) of every leaf."""
    return jax.tree.map(lambda a: a[idx], windows)


def window_spec(windows):
    """ShapeDtypeStructs of one window (no window axis): what a compiled program sees."""
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), windows)


def windows_sha256(windows) -> str:
    h = hashlib.sha256()
    for a in jax.tree.leaves(windows):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything that changes an audit's numbers; saved into results.json."""

    conditions: tuple[str, ...] = tuple(interventions.CONDITIONS)
    reassignments: int = 20         # R paired reassignments per randomized condition (paper: 20)
    seed: int = 0                   # reassignment r uses jax.random.split(key(seed), R)[r]
    batch_size: int = 64            # rows per forward: windows, or (reassignment, window) pairs
    max_reassign_bytes: int = 1 << 30  # reassigned copies of the cache held at once
    replay_atol: float = 0.0        # 0: replay must be bitwise equal to record
    level: float = 0.95
    n_resamples: int = 9999         # bootstrap resamples
    stats_seed: int = 0
    criteria: stats.Criteria = stats.Criteria()
    variance: bool = True
    per_window: bool = True         # keep every per-window ΔNLL in results.json

    def __post_init__(self):
        names = tuple(self.conditions)
        object.__setattr__(self, "conditions", names)
        unknown = [n for n in names if n not in interventions.CONDITIONS]
        if unknown:
            raise AuditError(f"unknown condition(s) {unknown}; choose from "
                             f"{list(interventions.CONDITIONS)}")
        if "correct" not in names:
            raise AuditError("the conditions must include 'correct' (every ΔNLL is against it)")
        if self.reassignments < 1 or self.batch_size < 1:
            raise AuditError("reassignments and batch_size must be positive")
        if self.replay_atol < 0:
            raise AuditError("replay_atol must be >= 0 (0 demands bitwise replay)")

    @classmethod
    def from_config(cls, c) -> "Settings":
        """From an audit ConfigDict (configs/audit_tiny.py's fields)."""
        conds = c.conditions
        if isinstance(conds, str):
            conds = tuple(interventions.CONDITIONS) if conds == "all" else \
                tuple(s.strip() for s in conds.split(",") if s.strip())
        conds = tuple(n for n in interventions.CONDITIONS if n in conds) + \
            tuple(n for n in conds if n not in interventions.CONDITIONS)  # registry order
        return cls(conditions=conds, reassignments=int(c.reassignments), seed=int(c.seed),
                   batch_size=int(c.batch_size), max_reassign_bytes=int(c.max_reassign_bytes),
                   replay_atol=float(c.replay_atol), level=float(c.stats.level),
                   n_resamples=int(c.stats.n_resamples), stats_seed=int(c.stats.seed),
                   criteria=stats.Criteria(float(c.criteria.small_nll_upper),
                                           float(c.criteria.high_retention_lower)),
                   variance=bool(c.variance), per_window=bool(c.per_window))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["criteria"] = dataclasses.asdict(self.criteria)
        return d


def applicable(settings: Settings, schema) -> tuple[Settings, dict]:
    """``(settings to run, {skipped condition: why})``: :data:`TOKEN_CONDITIONS` are skipped
    when no coefficient leaf has a ``token`` axis (see there)."""
    if any("token" in ax for ax in jax.tree.leaves(schema, is_leaf=is_axes)):
        return settings, {}
    skipped = {n: TOKEN_CONDITIONS[n] for n in settings.conditions if n in TOKEN_CONDITIONS}
    keep = tuple(n for n in settings.conditions if n not in skipped)
    return dataclasses.replace(settings, conditions=keep), skipped


def not_applicable_row(reason: str, label: str) -> dict:
    """A report row with no numbers: the condition was not run, and the row says why."""
    return {"estimate": None, "ci_low": None, "ci_high": None, "p": None, "label": label,
            "not_applicable": reason, "note": f"not applicable: {reason}"}


def reassignment_keys(seed: int, n: int):
    """The R keys every randomized condition shares (so the 2x2 factorial is paired)."""
    return jax.random.split(jax.random.key(seed), n)


def params_sha256(params) -> str:
    """sha256 over every parameter's path, dtype, shape and bytes (order-independent of dicts)."""
    h = hashlib.sha256()
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    for path, leaf in sorted(flat, key=lambda pl: jax.tree_util.keystr(pl[0])):
        a = np.asarray(jax.device_get(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{a.dtype}|{a.shape}|".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


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


# ------------------------------------------------------------------------------- engine

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
        self._transform: dict[str, Callable] = {}

    def reassign(self, names: tuple[str, ...]) -> Callable:
        """``(cache, keys) -> tuple of (R_c, ...) stacks``, one per randomized condition.

        One vmapped, jitted program over keys for the whole group: the conditions see the same
        key per reassignment (paired, as the 2x2 factorial needs) and XLA shares the donor maps
        and token permutations they have in common. Each applies to the *whole* cache, so a
        derangement is global over every evaluation window.
        """
        if names not in self._reassign:
            conds = [interventions.CONDITIONS[n] for n in names]
            self._reassign[names] = jax.jit(jax.vmap(
                lambda cache, key: tuple(c.fn(cache, self.schema, key) for c in conds),
                in_axes=(None, 0)))
        return self._reassign[names]

    def transform(self, name: str) -> Callable:
        """``(cache, calib, w_idx) -> rows``: a deterministic condition on one batch of rows
        (its means come from ``calib``, so the rows alone determine its output)."""
        if name not in self._transform:
            cond = interventions.CONDITIONS[name]
            self._transform[name] = jax.jit(
                lambda cache, calib, w_idx: cond.fn(self._take_cached_py(cache, w_idx),
                                                    self.schema, calib))
        return self._transform[name]


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


_max_abs_diff_jit = jax.jit(_max_abs_diff)


def _keys_per_chunk(R: int, group_bytes: int, budget: int) -> int:
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
    ``forwards`` counts the forward calls made (by program).
    """

    def __init__(self, apply_fn: Callable, schema, rows: int, window, task: Task = LM):
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
        if isinstance(window, (int, np.integer)):
            window = jax.ShapeDtypeStruct((int(window),), jnp.int32)
        self.rows, self.window, self.task = int(rows), window, task
        self.programs = coeff_programs(schema)
        self.forwards = collections.Counter()

        # The model's own apply, jitted as is, serves both modes. Anything else compiled into
        # the same program (even the loss) can change how XLA fuses the forward and so break
        # bitwise record/replay; the loss is a separate program on the logits.
        self.forward = jax.jit(apply_fn)
        self._nll = jax.jit(task.loss)

    def record_fn(self, params, batch):
        """``(per-window loss, logits, coeffs)`` with the controller running."""
        batch = jax.tree.map(jnp.asarray, batch)
        logits, coeffs = self.forward(params, self.task.inputs(batch))
        return self._nll(logits, batch), logits, coeffs

    def replay_fn(self, params, batch, coeffs):
        """``(per-window loss, logits)`` with ``coeffs`` used verbatim."""
        batch = jax.tree.map(jnp.asarray, batch)
        logits, _ = self.forward(params, self.task.inputs(batch), coeffs)
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
        return jax.eval_shape(self.record_fn, params, batch)[2]

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
        cache = jax.tree.map(full, self.schema, shapes, is_leaf=is_axes)

        P = self.programs
        nll_rec, nll_rep, diffs = [], [], []
        for start, keep in chunks:
            w_idx = jnp.arange(start, start + self.rows, dtype=jnp.int32)
            batch = _rows(windows, slice(start, start + self.rows))
            nll, logits, chunk = self.record_fn(params, batch)
            self.forwards["record"] += 1
            cache = P.write(cache, chunk, start, keep)
            nll_rec.append((nll, keep))
            if check:  # replay what the cache now holds, controller disabled
                nll2, logits2 = self.replay_fn(params, batch, P.take_cached(cache, w_idx))
                self.forwards["replay"] += 1
                nll_rep.append((nll2, keep))
                diffs.append(_max_abs_diff_jit(logits, logits2, keep))
            if bar is not None:
                bar.update(1 + check)
        if not check:
            return Recording(cache, _gather(nll_rec), None, None)
        d = np.asarray(jax.device_get(diffs), np.float64)
        max_d = float(np.nan if np.isnan(d).any() else d.max())
        return Recording(cache, _gather(nll_rec), _gather(nll_rep), max_d)

    # -- conditions
    def deterministic_nll(self, name: str, params, windows, rec: Recording, calib, bar=None):
        """(W,) loss under a deterministic condition (means over ``calib``), batch by batch."""
        windows = self.task.prepare(windows)
        fn, parts = self.programs.transform(name), []
        for start, keep in self._chunks(n_windows(windows)):
            w_idx = jnp.arange(start, start + self.rows, dtype=jnp.int32)
            nll, _ = self.replay_fn(params, _rows(windows, slice(start, start + self.rows)),
                                    fn(rec.coeffs, calib, w_idx))
            self.forwards["replay"] += 1
            parts.append((nll, keep))
            if bar is not None:
                bar.update(1)
        return _gather(parts)

    def randomized_nll(self, names: tuple[str, ...], params, windows, rec: Recording, keys,
                       max_reassign_bytes: int, bar=None) -> dict:
        """{name: (R, W) loss} for a group of randomized conditions sharing the R keys.

        Per chunk of keys, one vmapped program reassigns the whole cache for every condition;
        then (reassignment, window) pairs are flattened into fixed-size batches and replayed.
        """
        windows = self.task.prepare(windows)
        W, R = n_windows(windows), int(keys.shape[0])
        cache_bytes = sum(a.nbytes for a in jax.tree.leaves(rec.coeffs))
        per = _keys_per_chunk(R, cache_bytes * len(names), max_reassign_bytes)
        out = {n: np.empty((R, W), np.float32) for n in names}
        reassign = self.programs.reassign(names)
        for k0 in range(0, R, per):
            kc = keys[k0:k0 + per]
            n_keys = int(kc.shape[0])
            stacks = reassign(rec.coeffs, kc)
            parts = {n: [] for n in names}
            for start, keep in self._chunks(n_keys * W):
                p = np.arange(start, start + self.rows)
                r_idx, w_idx = jnp.asarray(p // W, jnp.int32), jnp.asarray(p % W, jnp.int32)
                batch = jax.tree.map(jnp.asarray, _rows(windows, p % W))
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

    def forward_count(self, n_eval: int, n_calib: int, settings: "Settings",
                      cache_bytes: int) -> int:
        """Forward calls one checkpoint's audit makes (the progress bar's total)."""
        n = lambda m: len(_chunks(m, self.rows))
        total = 2 * n(n_eval) + n(n_calib)
        names = [c for c in settings.conditions if c != "correct"]
        group = [c for c in names if interventions.CONDITIONS[c].randomized]
        total += n(n_eval) * (len(names) - len(group))
        if group:
            R = settings.reassignments
            per = _keys_per_chunk(R, cache_bytes * len(group), settings.max_reassign_bytes)
            total += len(group) * sum(n(min(per, R - k0) * n_eval) for k0 in range(0, R, per))
        return total


# ------------------------------------------------------------------------ one checkpoint

def replay_message(rec: Recording, atol: float) -> str:
    return (f"exact replay FAILED: replaying the cached coefficients with the controller "
            f"disabled gives max |Δlogit| = {rec.max_abs_dlogit:.3g} (allowed {atol:g}) and "
            f"NLL {np.mean(rec.nll_replay, dtype=np.float64):.9f} against the record's "
            f"{np.mean(rec.nll_record, dtype=np.float64):.9f}. No intervention result is valid "
            "without exact replay. Fix the model's apply so that apply(params, tokens, "
            "coeffs=recorded) uses the coefficients verbatim and compiles the combine step "
            "identically to the record (see jax.lax.optimization_barrier in the gate and MUDD "
            "families); set replay_atol > 0 only to accept a tolerance knowingly.")


def audit_checkpoint(engine: Engine, params, calib_windows, eval_windows, settings: Settings,
                     bar=None) -> dict:
    """Record, exact replay, every condition: per-window ΔNLL (Δloss) of one checkpoint.

    Returns ``{"replay", "nll_record", "nll_correct", "delta": {name: (R, W) | (W,)},
    "constant_along", "variance", "profiles", "forwards", "seconds"}`` (arrays are NumPy).
    """
    t0 = time.perf_counter()
    eval_windows = engine.task.prepare(eval_windows)
    calib_windows = engine.task.prepare(calib_windows)
    if n_windows(eval_windows) < 2:
        raise AuditError("cross-input reassignment needs at least 2 evaluation windows")
    before = collections.Counter(engine.forwards)
    rec = engine.record(params, eval_windows, check=True, bar=bar)
    exact = rec.max_abs_dlogit == 0.0 and np.array_equal(rec.nll_record, rec.nll_replay)
    ok = exact or (settings.replay_atol > 0 and np.isfinite(rec.max_abs_dlogit)
                   and rec.max_abs_dlogit <= settings.replay_atol)
    if not ok:
        raise ReplayError(replay_message(rec, settings.replay_atol))
    seconds = {"record_and_replay": time.perf_counter() - t0}
    t = time.perf_counter()
    cal = engine.record(params, calib_windows, check=False, bar=bar)
    seconds["calibration_record"] = time.perf_counter() - t

    base = rec.nll_replay.astype(np.float64)
    delta, constant = {}, {}
    group = tuple(n for n in settings.conditions if interventions.CONDITIONS[n].randomized)
    for name in settings.conditions:
        t = time.perf_counter()
        if name == "correct":   # the checked replay above: ΔNLL is 0 by construction
            delta[name] = np.zeros_like(base)
        elif name in group:
            if name == group[0]:
                keys = reassignment_keys(settings.seed, settings.reassignments)
                nlls = engine.randomized_nll(group, params, eval_windows, rec, keys,
                                             settings.max_reassign_bytes, bar=bar)
                delta.update({n: v.astype(np.float64) - base for n, v in nlls.items()})
                seconds["+".join(group)] = time.perf_counter() - t
            continue
        else:
            nll = engine.deterministic_nll(name, params, eval_windows, rec, cal.coeffs, bar=bar)
            delta[name] = nll.astype(np.float64) - base
            rows = engine.programs.transform(name)(
                rec.coeffs, cal.coeffs, jnp.arange(engine.rows, dtype=jnp.int32))
            constant[name] = constant_along(jax.device_get(rows), engine.schema)
        seconds[name] = time.perf_counter() - t
    delta = {n: delta[n] for n in settings.conditions}
    out = {
        "replay": {"exact": bool(exact), "max_abs_dlogit": rec.max_abs_dlogit,
                   "nll": float(np.mean(rec.nll_record, dtype=np.float64)),
                   "nll_replay": float(np.mean(rec.nll_replay, dtype=np.float64)),
                   "atol": settings.replay_atol, "windows": int(len(rec.nll_record))},
        "nll_record": rec.nll_record.astype(np.float64),
        "nll_correct": base,
        "delta": delta,
        "constant_along": constant,
    }
    cache = jax.device_get(rec.coeffs)
    if settings.variance:
        out["variance"] = variance.decompose_coeffs(cache, engine.schema)
    out["profiles"] = coefficient_profiles(cache, engine.schema)
    out["forwards"] = dict(engine.forwards - before)
    out["rows_per_forward"] = engine.rows
    seconds["total"] = time.perf_counter() - t0
    out["seconds"] = seconds
    return out


RANKED_AXES = ("token", "expert")


def constant_along(coeffs, schema) -> dict:
    """``{leaf path: [axes]}``: the ranked axes (token, expert) along which a leaf is constant.

    Why it matters: a controller that *ranks* its values meets exact ties there, and
    ``lax.top_k`` breaks ties by the lowest index. MoD's top-k over tokens then selects the
    first k positions of every window (and the router weight is the same for all of them);
    MoE's top-k over experts sends every token to the lowest-numbered expert, whose buffer
    fills in token order (later tokens drop). So a static profile or GlobalMean of routing
    scores is a fixed positional routing, not a smoothed version of the learned one. For
    gates (no ranking) a constant row is just what a static profile means.
    """
    out = {}
    flat = jax.tree_util.tree_flatten_with_path(schema, is_leaf=is_axes)[0]
    for (path, axes), a in zip(flat, jax.tree.leaves(coeffs)):
        a = np.asarray(a)
        const = [n for n in RANKED_AXES if n in axes and a.shape[axes.index(n)] > 1 and
                 np.all(a == np.take(a, [0], axis=axes.index(n)))]
        if const:
            out[jax.tree_util.keystr(path)] = const
    return out


def coefficient_profiles(cache, schema) -> dict | None:
    """Layer x position heatmap (mean over everything else), its layer means, the global mean.

    A leaf with a ``layer`` axis gives one row per layer; a per-layer list of leaves (MUDD)
    gives one row per leaf. Leaves without a ``token`` axis are skipped. An ``expert`` axis
    is reduced by its maximum (a token's top routing probability) rather than its mean,
    which is 1/E for every token since routing probabilities sum to one.
    """
    rows = []
    for axes, a in zip(jax.tree.leaves(schema, is_leaf=is_axes), jax.tree.leaves(cache)):
        if "token" not in axes:
            continue
        a = np.asarray(a, np.float64)
        if "expert" in axes:
            a = a.max(axis=axes.index("expert"), keepdims=True)
        keep = [axes.index(n) for n in ("layer", "token") if n in axes]
        m = a.mean(axis=tuple(i for i in range(a.ndim) if i not in keep))
        if len(keep) == 2 and keep[0] > keep[1]:
            m = m.T                                   # (token, layer) -> (layer, token)
        rows.extend(m if m.ndim == 2 else m[None])
    if not rows or len({r.shape for r in rows}) != 1:
        return None
    heat = np.stack(rows)
    return {"heatmap": heat, "layer_mean": heat.mean(axis=1), "global_mean": float(heat.mean())}


# ---------------------------------------------------------------------------- statistics

def condition_labels(schema) -> dict:
    """Display names: the paper's LayerMean / GlobalMean for gates, StaticMixMean /
    SourceUniformMean where coefficients mix source layers (MUDD)."""
    mixing = any("source" in ax for ax in jax.tree.leaves(schema, is_leaf=is_axes))
    labels = dict(LABELS)
    labels["static_profile"] = "StaticMixMean" if mixing else "LayerMean"
    labels["structure_removed"] = "SourceUniformMean" if mixing else "GlobalMean"
    return labels


def _constant_summary(value, n, unit, level):
    return {"estimate": float(value), "ci_low": float(value), "ci_high": float(value),
            "level": level, "n": n, "unit": unit, "ci_method": "degenerate", "p": np.nan,
            "p_method": "", "note": "all values equal"}


def _summarize(values, single: bool, s: Settings) -> dict:
    """Per-checkpoint means (several checkpoints) or per-window arrays (one checkpoint)."""
    x = np.asarray(values, np.float64)
    unit = stats.UNIT_WINDOWS if single else stats.UNIT_CHECKPOINT
    n = x.shape[-1] if single else x.size
    if x.size and np.ptp(x) == 0:   # e.g. Correct, or a constant controller: CI [v, v]
        out = _constant_summary(x.flat[0], n, unit, s.level)
        test = stats.sign_flip_test(x.reshape(-1, n).mean(axis=0), seed=s.stats_seed)
        out.update(p=test["p"], p_method=test["method"])
        return out
    if single:
        return stats.summarize_windows(x, level=s.level, seed=s.stats_seed,
                                       n_resamples=s.n_resamples)
    return stats.summarize_checkpoints(x, level=s.level, seed=s.stats_seed)


def _retention(static, ref, single: bool, s: Settings) -> dict:
    with np.errstate(divide="ignore", invalid="ignore"):
        if single:
            return stats.retention_ci(static, ref, level=s.level, seed=s.stats_seed,
                                      unit=stats.UNIT_WINDOWS, method="percentile",
                                      n_resamples=s.n_resamples)
        return stats.retention_ci(static, ref, level=s.level, seed=s.stats_seed,
                                  n_resamples=s.n_resamples)


def summarize(checkpoints: Sequence[dict], settings: Settings, schema) -> dict:
    """Combine per-checkpoint audits into the report's ``conditions`` / ``effects`` sections.

    Several checkpoints: each is one unit (checkpoint-level bootstrap CI, exact sign flips).
    One checkpoint: intervals over evaluation windows and reassignments, and ``unit`` says so.
    """
    s = settings
    single = len(checkpoints) == 1
    labels = condition_labels(schema)

    def unit_values(name):
        """(W,) or (R, W) per-window arrays for one checkpoint; else per-checkpoint means."""
        if single:
            return checkpoints[0]["delta"][name]
        return np.array([c["delta"][name].mean() for c in checkpoints])

    def window_means(name):  # reassignment-averaged per window: paired across conditions
        d = checkpoints[0]["delta"][name]
        return d.mean(axis=0) if d.ndim == 2 else d

    conditions = {}
    for name in s.conditions:
        row = _summarize(unit_values(name), single, s)
        row["label"] = labels.get(name, name)
        row["per_unit"] = [float(c["delta"][name].mean()) for c in checkpoints]
        conditions[name] = row

    ref = "structure_removed"
    for name in ("static_profile", "layer_position_mean"):
        if name in conditions and ref in conditions:
            if single:
                conditions[name]["retention"] = _retention(window_means(name),
                                                           window_means(ref), True, s)
            else:
                conditions[name]["retention"] = _retention(unit_values(name),
                                                           unit_values(ref), False, s)
    if "static_profile" in conditions:
        row = conditions["static_profile"]
        verdicts = {"practically_small": stats.practically_small(row, s.criteria)}
        if "retention" in row:
            v = stats.high_retention(row["retention"], s.criteria)
            if not conditions[ref]["estimate"] > 0:   # no gap to retain: no verdict
                v = dict(v, met=None, note="the reference ΔNLL is not positive")
            verdicts["high_retention"] = v
        row["verdicts"] = verdicts

    effects = {}
    if all(n in s.conditions for n in RANDOMIZED_2X2):
        if single:
            d = checkpoints[0]["delta"]
            e = stats.factorial_effects(0.0, d["cross_input"], d["token_shuffle"],
                                        d["cross_shuffle"])   # paired per (reassignment, window)
        else:
            e = stats.factorial_effects(0.0, *(unit_values(n) for n in RANDOMIZED_2X2))
        for name in EFFECTS:
            effects[name] = _summarize(e[name], single, s)
            effects[name]["per_unit"] = (
                [float(np.mean(e[name]))] if single else [float(v) for v in e[name]])
        holm = stats.holm([effects[n]["p"] for n in EFFECTS])
        for name, p in zip(EFFECTS, holm):
            effects[name]["p_holm"] = float(p)
            effects[name]["p_holm_method"] = "Holm over the three factorial effects " \
                "(statsmodels multipletests, method='holm')"
    return {"unit": stats.UNIT_WINDOWS if single else stats.UNIT_CHECKPOINT,
            "conditions": conditions, "effects": effects}


def _mean_dicts(dicts):
    """Element-wise mean of nested dicts of numbers (variance shares across checkpoints)."""
    first = dicts[0]
    if isinstance(first, dict):
        return {k: _mean_dicts([d[k] for d in dicts]) for k in first}
    return float(np.mean([np.nan if v is None else v for v in dicts]))


def assemble_results(title: str, checkpoints: Sequence[dict], infos: Sequence[dict],
                     settings: Settings, schema, meta: dict, not_applicable: dict | None = None,
                     task: Task = LM) -> dict:
    """The full results dict (report.write_report's format) from per-checkpoint audits.

    ``infos``: one dict per checkpoint (name, run dir, step, params sha256, ...).
    ``not_applicable``: conditions skipped (see :func:`applicable`), each a row without
    numbers; the factorial effects, which need them, are rows without numbers too.
    """
    res = summarize(checkpoints, settings, schema)
    if not_applicable:
        labels = condition_labels(schema)
        rows = dict(res["conditions"], **{n: not_applicable_row(why, labels.get(n, n))
                                          for n, why in not_applicable.items()})
        res["conditions"] = {n: rows[n] for n in interventions.CONDITIONS if n in rows}
        missing = [n for n in RANDOMIZED_2X2 if n in not_applicable]
        if missing and not res["effects"]:
            why = f"the 2x2 factorial needs {' and '.join(missing)}, not applicable here"
            res["effects"] = {n: not_applicable_row(why, n) for n in EFFECTS}
    replays = [c["replay"] for c in checkpoints]
    dl = [r["max_abs_dlogit"] for r in replays]
    results = {
        "title": title,
        "unit": res["unit"],
        "loss": task.description,
        "replay": {"exact": all(r["exact"] for r in replays),
                   "max_abs_dlogit": float(np.max(dl)),
                   "nll": float(np.mean([r["nll"] for r in replays])),
                   "nll_replay": float(np.mean([r["nll_replay"] for r in replays])),
                   "per_checkpoint": replays},
        "conditions": res["conditions"],
        "effects": res["effects"],
    }
    if settings.variance:
        results["variance"] = _mean_dicts([c["variance"] for c in checkpoints])
    profs = [c.get("profiles") for c in checkpoints]
    if profs[0] is not None and all(p is not None and np.shape(p["heatmap"]) ==
                                    np.shape(profs[0]["heatmap"]) for p in profs):
        heat = np.mean([p["heatmap"] for p in profs], axis=0)
        results["profiles"] = {"heatmap": heat, "layer_mean": heat.mean(axis=1),
                               "global_mean": float(np.mean([p["global_mean"] for p in profs]))}
    keys = reassignment_keys(settings.seed, settings.reassignments)
    per_ckpt = []
    for info, c in zip(infos, checkpoints):
        entry = dict(info)
        entry.update(replay=c["replay"], constant_along=c.get("constant_along", {}),
                     nll_record=float(c["nll_record"].mean()),
                     nll_correct=float(c["nll_correct"].mean()),
                     delta_nll={n: float(d.mean()) for n, d in c["delta"].items()},
                     forwards=c["forwards"], rows_per_forward=c["rows_per_forward"],
                     seconds=c["seconds"])
        if settings.variance:
            entry["variance"] = c["variance"]
        if settings.per_window:
            entry["per_window"] = {"nll_correct": c["nll_correct"],
                                   "delta_nll": dict(c["delta"])}
        per_ckpt.append(entry)
    results["meta"] = {
        **meta,
        "settings": settings.to_dict(),
        "task": task.name,
        "not_applicable": dict(not_applicable or {}),
        "seeds": {"reassignment_seed": settings.seed,
                  "key_derivation": "jax.random.split(jax.random.key(seed), reassignments)[r]",
                  "prng_impl": str(jax.config.jax_default_prng_impl),
                  "key_data": np.asarray(jax.random.key_data(keys)),
                  "bootstrap_seed": settings.stats_seed},
        "checkpoints": per_ckpt,
        "versions": {"jax": jax.__version__, "backend": jax.default_backend(),
                     "device": jax.devices()[0].device_kind},
    }
    return results


def audit_targets(targets: Sequence[dict], calib_windows, eval_windows, settings: Settings,
                  title: str, meta: dict | None = None, progress: bool = True,
                  engines: dict | None = None, task: Task = LM) -> dict:
    """Audit every target (one checkpoint each) on the same windows; the results dict.

    A target is ``{"apply_fn", "schema", "params", "info": {...}}``; targets that share an
    ``engine_key`` share one compiled Engine (pass ``engines``, a dict, to keep them across
    calls). ``task`` says what a window is and how it is scored (:data:`LM`, :data:`CLASSIFY`).
    Conditions that cannot apply to the schema are skipped and reported (:func:`applicable`).
    """
    from tqdm.auto import tqdm

    eval_windows, calib_windows = task.prepare(eval_windows), task.prepare(calib_windows)
    spec = window_spec(eval_windows)
    if window_spec(calib_windows) != spec:
        raise AuditError(f"calibration windows have shapes {window_spec(calib_windows)} but "
                         f"evaluation windows {spec}; use one seq_len / input size")
    if len({schema_signature(t["schema"]) for t in targets}) > 1:
        raise AuditError("the checkpoints have different coefficient schemas; audit one "
                         "model family and variant per run")
    settings, skipped = applicable(settings, targets[0]["schema"])
    n_eval, n_calib = n_windows(eval_windows), n_windows(calib_windows)
    rows = min(settings.batch_size, n_eval, n_calib)
    engines = {} if engines is None else engines
    engine_of = []
    for t in targets:
        key = (t.get("engine_key", id(t)), rows, str(spec), task.name)
        if key not in engines:
            engines[key] = Engine(t["apply_fn"], t["schema"], rows, spec, task)
        engine_of.append(engines[key])
    total = 0
    for t, eng in zip(targets, engine_of):
        total += eng.forward_count(n_eval, n_calib, settings, eng.cache_bytes(t["params"], n_eval))
    bar = tqdm(total=total, desc="audit forwards", unit="fwd", disable=not progress,
               mininterval=1)
    ckpts = []
    try:
        for t, eng in zip(targets, engine_of):
            bar.set_postfix_str(t["info"].get("name", ""))
            ckpts.append(audit_checkpoint(eng, t["params"], calib_windows, eval_windows,
                                          settings, bar=bar))
    finally:
        bar.close()
    meta = dict(meta or {})
    shapes = {"seq_len": int(spec.shape[0])} if task is LM else {
        "window_shapes": jax.tree.map(lambda s: list(s.shape), spec)}
    meta["windows"] = {**shapes, "calibration": n_calib, "evaluation": n_eval,
                       "calibration_sha256": windows_sha256(calib_windows),
                       "evaluation_sha256": windows_sha256(eval_windows),
                       **meta.get("windows", {})}
    return assemble_results(title, ckpts, [t["info"] for t in targets], settings,
                            targets[0]["schema"], meta, not_applicable=skipped, task=task)


# ------------------------------------------------------------------------------- inputs

def _opt(cfg, name, default=None):
    """``cfg.name`` if the field exists and is set, else ``default``."""
    v = cfg.get(name, None) if cfg is not None else None
    return default if v is None or v == "" else v


def is_classifier_run(config) -> bool:
    """train_mlp.py runs: ``data.dataset`` and an MLP model config (no ``model.family``)."""
    return "dataset" in config.data and "family" not in config.model


def family_variant(config) -> tuple[str, str]:
    if is_classifier_run(config):
        return "gated_mlp", config.model.variant
    return config.model.family, config.model.variant


@functools.lru_cache(maxsize=2)
def _tabular(dataset: str, data_dir):
    from dynjax.data import tabular
    try:
        return tabular.load(dataset, data_dir)
    except tabular.DataError as e:
        raise AuditError(str(e)) from None


def classifier_model(config):
    """The GatedMLP of a train_mlp.py run (input and class counts come from its dataset)."""
    from dynjax.data import tabular
    from dynjax.models.gated_mlp import GatedMLP
    from dynjax.train import classify

    splits = _tabular(config.data.dataset, config.data.get("data_dir"))
    return GatedMLP(classify.model_dict(config, splits["train"][0].shape[1],
                                         tabular.num_classes(splits)))


def load_classifier(run_dir, config, model):
    """``(apply_fn, params, step, schedule)`` of a train_mlp.py run at its latest checkpoint.

    The gates run at the schedule of that step (tau, theta, gates forced open in warm-up),
    i.e. the function the run's own evaluation measured; hard masks are re-thresholded from
    the (replayed) gate probabilities.
    """
    from dynjax.train import checkpoint, classify

    mngr = checkpoint.manager(run_dir, every=1, keep=1_000_000)
    step = mngr.latest_step()
    if step is None:
        raise AuditError(f"no checkpoint under {run_dir}/checkpoints; train it first")
    tx = classify.make_tx(config)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device),
        jax.eval_shape(lambda: classify.init_state(model, tx, jax.random.key(0))))
    params = checkpoint.restore(mngr, abstract)["params"]
    sched = jax.device_get(classify.gate_schedule(config, step))
    sched = {"tau": float(sched["tau"]), "theta": float(sched["theta"]),
             "gates_open": bool(sched["gates_open"])}
    return functools.partial(model.apply, **sched), params, int(step), sched


def load_run_targets(run_dirs: Sequence[str]) -> tuple[list[dict], list]:
    """One target per run directory written by train.py or train_mlp.py; (targets, configs).

    Checks, before loading any parameters, that each directory exists, is a dynjax run, and
    holds a model that records coefficients.
    """
    from dynjax.models import build
    from dynjax.train import checkpoint

    if not run_dirs:
        raise AuditError("no checkpoints given: pass --checkpoints RUN_DIR [RUN_DIR ...] "
                         "(run directories written by train.py) or --muddpythia HF_DIR")
    configs = []
    for d in run_dirs:
        p = pathlib.Path(d)
        if not p.is_dir():
            raise AuditError(f"run directory {d} does not exist; train one first, e.g. "
                             f"`python train.py --config=configs/tiny.py:feature_gate "
                             f"--workdir={d}`, or pass an existing run directory")
        try:
            config = checkpoint.read_config(d)
        except FileNotFoundError as e:
            raise AuditError(str(e)) from None
        model = (classifier_model(config) if is_classifier_run(config)
                 else build(config.model.to_dict()))
        if not jax.tree.leaves(model.schema, is_leaf=is_axes):
            family, variant = family_variant(config)
            raise AuditError(
                f"{d} holds a {variant!r} {family} model, which records no coefficients: "
                "there is nothing to audit. Audit a variant with coefficients (uniform, "
                "layer_static, feature_gate; mod, moe, mode_*; dgate, structured) or MUDDPythia")
        configs.append(config)
    def same(what, key):
        values = {json.dumps(key(c), sort_keys=True) for c in configs}
        if len(values) > 1:
            raise AuditError(f"the checkpoints differ in {what} ({sorted(values)}); audit the "
                             "seeds of one model and data configuration together")
    same("data.seq_len", lambda c: c.data.get("seq_len"))
    same("model family and variant", family_variant)
    same("training data", lambda c: [c.data.get(k) for k in ("source", "path", "tfds_name",
                                                             "dataset")])
    targets = []
    for d, config in zip(run_dirs, configs):
        extra = {}
        if is_classifier_run(config):
            model = classifier_model(config)
            apply_fn, params, step, sched = load_classifier(d, config, model)
            extra["gate_schedule"] = sched
            key = [config.model.to_dict(), sched]
        else:
            try:
                _, model, params = checkpoint.load_params(d)
            except FileNotFoundError as e:
                raise AuditError(str(e)) from None
            apply_fn, key = model.apply, config.model.to_dict()
            step = checkpoint.manager(d, every=1, keep=1_000_000).latest_step()
        family, variant = family_variant(config)
        info = {"name": pathlib.Path(d).resolve().name, "run_dir": str(pathlib.Path(d).resolve()),
                "step": int(step), "seed": int(config.seed), "family": family,
                "variant": variant, "params_sha256": params_sha256(params),
                "n_params": int(sum(np.size(x) for x in jax.tree.leaves(params))), **extra}
        eval_path = pathlib.Path(d) / "eval.json"
        if eval_path.exists():
            info["train_eval"] = json.loads(eval_path.read_text())
        else:
            info["note"] = (f"{d} has no eval.json (training unfinished?): auditing its latest "
                            f"checkpoint, step {step}")
        targets.append({"apply_fn": apply_fn, "schema": model.schema, "params": params,
                        "info": info, "engine_key": json.dumps(key, sort_keys=True)})
    return targets, configs


def _resolve_seq_len(requested, trained: int, what: str) -> int:
    if requested is None:
        return trained
    if int(requested) != trained:
        raise AuditError(f"{what} was trained with data.seq_len={trained} but the audit asks "
                         f"for data.seq_len={requested}; drop the override (the audit uses the "
                         f"checkpoint's) or set --config.data.seq_len={trained}")
    return trained


def _windows(name: str, split, seq_len: int, n: int, notes: list) -> np.ndarray:
    from dynjax.data import text

    w = text.eval_windows(np.asarray(split), seq_len, n)
    if len(w) < n:
        notes.append(f"{name}: {len(w)} non-overlapping windows of {seq_len} tokens available, "
                     f"{n} requested")
    return w


def run_windows(data_cfg, run_config, seq_len: int, n_calib: int, n_eval: int):
    """Calibration windows from the validation split, evaluation windows from test (disjoint
    by construction), from the data the run was trained on unless the audit config overrides."""
    from dynjax.data import text

    src = dict(source=_opt(data_cfg, "source", run_config.data.source),
               path=_opt(data_cfg, "path", run_config.data.get("path")),
               tfds_name=_opt(data_cfg, "tfds_name", run_config.data.get("tfds_name")),
               data_dir_=_opt(data_cfg, "data_dir", run_config.data.get("data_dir")))
    splits = text.load_splits(**src)
    notes = []
    calib = _windows("calibration (validation split)", splits["validation"], seq_len, n_calib,
                     notes)
    ev = _windows("evaluation (test split)", splits["test"], seq_len, n_eval, notes)
    info = {"source": src["source"], "path": src["path"], "tfds_name": src["tfds_name"],
            "calibration_split": "validation", "evaluation_split": "test", "notes": notes}
    return calib, ev, info


def classifier_windows(data_cfg, run_config, n_calib: int, n_eval: int, seed: int = 0):
    """Calibration examples from the validation split, evaluation examples from test (one
    window = one labelled example). A fixed-seed random subset of each split, since a split
    may be sorted by class (mnist5k's is)."""
    dataset = _opt(data_cfg, "dataset", run_config.data.dataset)
    data_dir = _opt(data_cfg, "data_dir", run_config.data.get("data_dir"))
    splits = _tabular(dataset, data_dir)
    notes, out = [], []
    for name, split, n in (("calibration (validation split)", "validation", n_calib),
                           ("evaluation (test split)", "test", n_eval)):
        x, y = splits[split]
        if len(x) < n:
            notes.append(f"{name}: {len(x)} examples available, {n} requested")
        idx = np.random.default_rng([seed, len(out)]).permutation(len(x))[:n]
        out.append({"x": x[idx], "y": y[idx]})
    info = {"dataset": dataset, "calibration_split": "validation", "evaluation_split": "test",
            "subset": f"numpy default_rng([{seed}, 0 | 1]) permutation, first n", "notes": notes}
    return out[0], out[1], info


def _read_text(path) -> str:
    p = pathlib.Path(path).expanduser()
    if not p.is_file():
        raise AuditError(f"text file {path} does not exist; point data.validation_path and "
                         "data.test_path at WikiText-style files (e.g. wiki.valid.raw, "
                         "wiki.test.raw) or data.path at one text file")
    return p.read_text("utf-8", errors="replace")


def muddpythia_windows(data_cfg, tokenizer, vocab_size: int, seq_len: int, n_calib: int,
                       n_eval: int):
    """Token windows for MUDDPythia from local text: WikiText-style validation and test files
    (``data.validation_path`` / ``data.test_path``), or one file or folder (``data.path``)
    cut 90/5/5 into non-overlapping splits. Tokenized with the checkpoint's tokenizer.json;
    without one, bytes are the tokens (only for byte-vocabulary models)."""
    from dynjax.data import text

    val_path, test_path = _opt(data_cfg, "validation_path"), _opt(data_cfg, "test_path")
    if val_path and test_path:
        texts = {"validation": _read_text(val_path), "test": _read_text(test_path)}
        src = {"validation_path": str(val_path), "test_path": str(test_path)}
    elif _opt(data_cfg, "path"):
        splits = text.load_splits("files", str(data_cfg.path))
        texts = {k: splits[k].tobytes().decode("utf-8", "replace") for k in ("validation", "test")}
        src = {"path": str(data_cfg.path), "split": "90/5/5 of each document"}
    else:
        raise AuditError("MUDDPythia needs local text: set --config.data.validation_path and "
                         "--config.data.test_path (e.g. wikitext-103-raw/wiki.valid.raw and "
                         "wiki.test.raw) or --config.data.path=FILE_OR_FOLDER")

    def encode(t):
        if tokenizer is not None:
            return np.asarray(tokenizer.encode(t).ids, np.int32)
        if vocab_size < 256:
            raise AuditError(f"the checkpoint directory has no tokenizer.json and its vocabulary "
                             f"({vocab_size}) is not bytes; copy the model's tokenizer.json "
                             "into it (pip install tokenizers)")
        return np.frombuffer(t.encode("utf-8"), np.uint8).astype(np.int32)

    notes = []
    calib = _windows("calibration (validation)", encode(texts["validation"]), seq_len, n_calib,
                     notes)
    ev = _windows("evaluation (test)", encode(texts["test"]), seq_len, n_eval, notes)
    src.update(tokenizer="tokenizer.json" if tokenizer is not None else "bytes", notes=notes)
    return calib, ev, src


def muddpythia_plan(path: str, dtype: str, seq_len: int, n_calib: int, n_eval: int,
                    settings: Settings, flops_per_second=None) -> dict:
    """Memory and time estimate of a MUDDPythia audit, from config.json alone (no weights)."""
    from dynjax.models import muddpythia

    cfg_path = pathlib.Path(path) / "config.json"
    if not cfg_path.exists():
        return {}
    cfg = muddpythia.Config.from_hf(json.loads(cfg_path.read_text()), dtype=dtype)
    rows = min(settings.batch_size, n_calib, n_eval)
    est = muddpythia.memory_time_estimate(cfg, n_eval, seq_len, rows, flops_per_second)
    n_rand = sum(interventions.CONDITIONS[c].randomized for c in settings.conditions)
    n_det = sum(not interventions.CONDITIONS[c].randomized for c in settings.conditions) - 1
    replays = n_eval * (1 + n_det + n_rand * settings.reassignments)
    calib_cache = est["coeff_cache_bytes"] * n_calib // max(n_eval, 1)
    per = _keys_per_chunk(settings.reassignments, est["coeff_cache_bytes"] * max(n_rand, 1),
                          settings.max_reassign_bytes)
    plan = {
        "model": {"n_layer": cfg.n_layer, "dim": cfg.dim, "dtype": cfg.dtype,
                  "params": est["param_count"]},
        "windows": {"calibration": n_calib, "evaluation": n_eval, "seq_len": seq_len,
                    "rows_per_forward": rows},
        "forward_windows": {"record": n_eval + n_calib, "replay": replays},
        "bytes": {"params": est["param_bytes"],
                  "coeff_cache_eval_plus_calib": est["coeff_cache_bytes"] + calib_cache,
                  "reassigned_copies": per * n_rand * est["coeff_cache_bytes"],
                  "activations_per_batch": est["activation_bytes_per_batch"]},
        "flops": (est["record_flops_per_window"] * (n_eval + n_calib)
                  + est["replay_flops_per_window"] * replays),
    }
    plan["bytes"]["peak_device_estimate"] = (
        est["param_bytes"] + plan["bytes"]["coeff_cache_eval_plus_calib"]
        + plan["bytes"]["reassigned_copies"] + 2 * est["activation_bytes_per_batch"])
    if flops_per_second:
        plan["seconds_estimate"] = plan["flops"] / float(flops_per_second)
    return plan


def format_plan(plan: dict) -> str:
    gb = lambda b: f"{b / 2**30:.2f} GiB"
    lines = [f"MUDDPythia audit plan: {plan['model']['n_layer']} layers, dim "
             f"{plan['model']['dim']}, {plan['model']['params'] / 1e9:.3f}B params, "
             f"{plan['model']['dtype']}",
             f"  windows: {plan['windows']['calibration']} calibration + "
             f"{plan['windows']['evaluation']} evaluation x {plan['windows']['seq_len']} tokens, "
             f"{plan['windows']['rows_per_forward']} rows per forward",
             f"  forwards (windows): record {plan['forward_windows']['record']}, "
             f"replay {plan['forward_windows']['replay']}; {plan['flops']:.3g} FLOP"]
    lines += [f"  {k.replace('_', ' ')}: {gb(v)}" for k, v in plan["bytes"].items()]
    if "seconds_estimate" in plan:
        lines.append(f"  time at the given FLOP/s: {plan['seconds_estimate'] / 60:.1f} min")
    else:
        lines.append("  time: set --config.muddpythia.flops_per_second for an estimate")
    return "\n".join(lines)


def load_muddpythia_target(path: str, dtype: str):
    """(target, cfg, tokenizer) for a local MUDDPythia HF directory."""
    from dynjax.models import muddpythia

    if not pathlib.Path(path).is_dir():
        raise AuditError(f"MUDDPythia directory {path} does not exist; download the checkpoint "
                         "(config.json, *.safetensors, tokenizer.json) to a local folder first")
    try:
        cfg, params, tokenizer = muddpythia.load_hf_dir(str(path), dtype=dtype)
    except FileNotFoundError as e:
        raise AuditError(f"{e}; the directory needs config.json and the *.safetensors "
                         "weights") from None
    params = jax.device_put(params)
    info = {"name": pathlib.Path(path).resolve().name, "run_dir": str(pathlib.Path(path).resolve()),
            "family": "muddpythia", "variant": "muddpythia", "dtype": cfg.dtype,
            "params_sha256": params_sha256(params),
            "n_params": int(sum(np.size(x) for x in jax.tree.leaves(params)))}
    target = {"apply_fn": functools.partial(muddpythia.apply, cfg),
              "schema": muddpythia.schema(cfg), "params": params, "info": info,
              "engine_key": ("muddpythia", cfg)}
    return target, cfg, tokenizer


def audit_from_config(config, run_dirs: Sequence[str] = (), muddpythia_dir: str | None = None,
                      out: str | None = None, progress: bool = True, log=print) -> dict:
    """The whole audit.py program: inputs, engine, statistics, report. Returns the results."""
    from dynjax.audit import report

    settings = Settings.from_config(config)
    task = LM
    dc = config.data
    n_calib, n_eval = int(dc.calib_windows), int(dc.eval_windows)
    mudd = muddpythia_dir or _opt(config.get("muddpythia"), "path")
    if mudd and run_dirs:
        raise AuditError("pass either --checkpoints (dynjax runs) or --muddpythia, not both")
    if mudd:
        mc = config.muddpythia
        seq_len = int(_opt(dc, "seq_len", 512))
        plan = muddpythia_plan(mudd, mc.dtype, seq_len, n_calib, n_eval, settings,
                               _opt(mc, "flops_per_second"))
        if plan:
            log(format_plan(plan))
        target, cfg, tokenizer = load_muddpythia_target(mudd, mc.dtype)
        if seq_len > cfg.block_size:
            raise AuditError(f"data.seq_len={seq_len} exceeds the model's block_size "
                             f"{cfg.block_size}; set --config.data.seq_len={cfg.block_size} or "
                             "less")
        calib, ev, data_info = muddpythia_windows(dc, tokenizer, cfg.vocab_size, seq_len,
                                                  n_calib, n_eval)
        targets = [target]
        title = f"FCA: MUDDPythia ({target['info']['name']}), 1 checkpoint"
        meta = {"plan": plan}
    else:
        targets, configs = load_run_targets(run_dirs)
        if is_classifier_run(configs[0]):
            if _opt(dc, "seq_len") is not None:
                raise AuditError("data.seq_len does not apply to a classifier run (a window is "
                                 "one example); drop the override")
            task = CLASSIFY
            calib, ev, data_info = classifier_windows(dc, configs[0], n_calib, n_eval)
        else:
            seq_len = _resolve_seq_len(_opt(dc, "seq_len"), int(configs[0].data.seq_len),
                                       f"checkpoint {run_dirs[0]}")
            calib, ev, data_info = run_windows(dc, configs[0], seq_len, n_calib, n_eval)
        family, variant = family_variant(configs[0])
        title = f"FCA: {family}/{variant}, {len(targets)} checkpoint" + \
            ("s" if len(targets) > 1 else "")
        meta = {"run_configs": [c.to_dict() for c in configs]}
        for t in targets:
            if "note" in t["info"]:
                log(f"warning: {t['info']['note']}")
    for note in data_info.get("notes", []):
        log(f"warning: {note}")
    meta.update(config=config.to_dict(), data=data_info)
    t0 = time.perf_counter()
    results = audit_targets(targets, calib, ev, settings, title, meta=meta, progress=progress,
                            task=task)
    for name in results["meta"]["not_applicable"]:
        log(f"note: {name} not applicable: {results['meta']['not_applicable'][name]}")
    results["meta"]["wall_seconds"] = time.perf_counter() - t0
    if len(targets) == 1:
        results["meta"]["single_checkpoint_note"] = (
            "one checkpoint: intervals describe stability over evaluation windows and "
            "reassignments for this checkpoint, not uncertainty across training seeds")
    if out:
        report.write_report(results, out)
    return results


# ------------------------------------------------------------------------------ printing

def verdict_table(results: dict) -> str:
    """A short plain-text table: condition, ΔNLL, CI, p, retention, verdicts; then effects."""
    fmt = lambda v, f="{:+.6f}": "—" if v is None or not np.isfinite(v) else f.format(v)
    lines = [results["title"],
             f"unit: {results['unit']}; loss: {results.get('loss', LM.description)}",
             f"exact replay: {'passed' if results['replay']['exact'] else 'within tolerance'}"
             f" (max |Δlogit| {results['replay']['max_abs_dlogit']:.3g}, "
             f"NLL {results['replay']['nll']:.6f})",
             f"{'condition':<20} {'ΔNLL':>10} {'95% CI':>25} {'p':>8}  retention / verdict"]
    for name, r in results["conditions"].items():
        ci = f"[{fmt(r['ci_low'])}, {fmt(r['ci_high'])}]"
        extra = ""
        if r.get("retention"):
            extra = f"retention {fmt(r['retention']['estimate'], '{:.2%}')} " \
                    f"[{fmt(r['retention']['ci_low'], '{:.2%}')}, " \
                    f"{fmt(r['retention']['ci_high'], '{:.2%}')}]"
        if r.get("not_applicable"):
            extra = f"not applicable: {r['not_applicable']}"
        for vname, v in (r.get("verdicts") or {}).items():
            met = {True: "MET", False: "not met", None: "undetermined"}[v["met"]]
            extra += f"; {vname}: {met}"
        lines.append(f"{r.get('label', name):<20} {fmt(r['estimate']):>10} {ci:>25} "
                     f"{fmt(r.get('p'), '{:.3g}'):>8}  {extra}")
    for name, e in results.get("effects", {}).items():
        if e.get("not_applicable"):
            lines.append(f"{name:<20} {'—':>10} not applicable: {e['not_applicable']}")
            continue
        lines.append(f"{name:<20} {fmt(e['estimate']):>10} "
                     f"{'[' + fmt(e['ci_low']) + ', ' + fmt(e['ci_high']) + ']':>25} "
                     f"{fmt(e.get('p'), '{:.3g}'):>8}  Holm p {fmt(e.get('p_holm'), '{:.3g}')}")
    return "\n".join(lines)
