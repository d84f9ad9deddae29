"""What an audit is asked to do: the settings that change its numbers and the conditions
that apply to a schema (the task, what a window is and its loss: :mod:`dynjax.tasks`).
Shared by every audit module; it imports none of them."""
from __future__ import annotations

import dataclasses
import hashlib

import jax
import numpy as np

from dynjax.audit import interventions, stats
from dynjax.coeffs import is_axes
from dynjax.errors import AuditError
from dynjax.tasks import LM, Task

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


def n_windows(windows) -> int:
    return int(jax.tree.leaves(windows)[0].shape[0])


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
        unknown = [n for n in names if n not in interventions.REGISTRY]
        if unknown:
            raise AuditError(f"unknown condition(s) {unknown}; choose from "
                             f"{list(interventions.REGISTRY)}")
        if "correct" not in names:
            raise AuditError("the conditions must include 'correct' (every ΔNLL is against it)")
        if self.reassignments < 1 or self.batch_size < 1:
            raise AuditError("reassignments and batch_size must be positive")
        if self.replay_atol < 0:
            raise AuditError("replay_atol must be >= 0 (0 demands bitwise replay)")

    @classmethod
    def from_config(cls, c) -> "Settings":
        """From an audit ConfigDict (configs/audit_tiny.py's fields). ``conditions``: a
        comma-separated list, "paper" (the paper's seven) or "all" (with the routing ones)."""
        conds = c.conditions
        if isinstance(conds, str):
            named = {"all": tuple(interventions.REGISTRY),
                     "paper": tuple(interventions.CONDITIONS)}
            conds = named[conds] if conds in named else \
                tuple(s.strip() for s in conds.split(",") if s.strip())
        conds = tuple(n for n in interventions.REGISTRY if n in conds) + \
            tuple(n for n in conds if n not in interventions.REGISTRY)  # registry order
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


def applicable(settings: Settings, schema, task: "Task | None" = None,
               facts: dict | None = None) -> tuple[Settings, dict]:
    """``(settings to run, {skipped condition: why})``: :data:`TOKEN_CONDITIONS` are skipped
    when no coefficient leaf has a ``token`` axis (see there); a routing condition when no
    leaf has the axes it acts on, when it needs token ids and the task has none, or when it
    needs a fact of the model (``facts``, e.g. top_k) the checkpoint does not give."""
    leaves = jax.tree.leaves(schema, is_leaf=is_axes)
    facts = facts or {}
    skipped = {}
    for name in settings.conditions:
        cond = interventions.REGISTRY[name]
        if name in TOKEN_CONDITIONS and not any("token" in ax for ax in leaves):
            skipped[name] = TOKEN_CONDITIONS[name]
        elif cond.axes and not any(all(a in ax for a in cond.axes) for ax in leaves):
            skipped[name] = f"no coefficient has the axes {' and '.join(cond.axes)}"
        elif "tokens" in cond.needs and task is not None and task is not LM:
            skipped[name] = "it needs token ids, and a window here is not a token sequence"
        elif any(n != "tokens" and n not in facts for n in cond.needs):
            skipped[name] = (f"the checkpoint does not say its "
                             f"{', '.join(n for n in cond.needs if n != 'tokens')}")
    if not skipped:
        return settings, {}
    keep = tuple(n for n in settings.conditions if n not in skipped)
    return dataclasses.replace(settings, conditions=keep), skipped


def not_applicable_row(reason: str, label: str) -> dict:
    """A report row with no numbers: the condition was not run, and the row says why."""
    return {"estimate": None, "ci_low": None, "ci_high": None, "p": None, "label": label,
            "not_applicable": reason, "note": f"not applicable: {reason}"}


def reassignment_keys(seed: int, n: int):
    """The R keys every randomized condition shares (so the 2x2 factorial is paired)."""
    return jax.random.split(jax.random.key(seed), n)
