"""The non-finite guard and the loss-spike warning: training that diverged is stopped (or
its updates skipped), never saved, and a loss that explodes is said out loud.

:func:`guarded_step` carries a small device-side record of bad steps (a non-finite loss or
gradient norm) read only where the loop already syncs; ``train.skip_nonfinite`` skips them
within ``train.max_skipped_in_a_row``. The spike and worse-than-chance warnings compare
logged losses with a window's median. Details: docs/reliability.md.
"""
from __future__ import annotations

import collections
import math
import statistics

import jax
import jax.numpy as jnp

SPIKE_WINDOW = 20
DEFAULT_SPIKE_FACTOR = 3.0
MAX_SKIPPED_IN_A_ROW = 20   # train.max_skipped_in_a_row's default
CHANCE_MARGIN = 1.25        # an initial loss sits near ln(vocab); this far above it is not


def init_record(sharding=None):
    """The record before the first step. ``sharding``: where the step's output record lives
    (replicated over the task's mesh); placed there from the start, the second step's
    record has the first's type and the guarded step compiles once, not twice."""
    record = {"first_bad": jnp.int32(-1), "skipped": jnp.int32(0), "streak": jnp.int32(0)}
    return record if sharding is None else jax.device_put(record, sharding)


def loss_of(metrics):
    """The loss a task's step reports (a classifier's ``loss``-free metrics: ``ce``)."""
    return metrics["loss"] if "loss" in metrics else metrics["ce"]


def guarded_step(step_fn, skip_nonfinite: bool, compiler_options=None):
    """``(state, record, *batch) -> (state, record, metrics)``: ``step_fn`` plus the guard."""
    def step(state, record, *batch):
        new, metrics = step_fn(state, *batch)
        finite = jnp.isfinite(loss_of(metrics)) & jnp.isfinite(metrics["grad_norm"])
        if skip_nonfinite:
            keep = {k: v for k, v in new.items() if k != "step"}
            old = {k: v for k, v in state.items() if k != "step"}
            new = {"step": new["step"], **jax.tree.map(
                lambda n, o: jnp.where(finite, n, o), keep, old)}
        first = jnp.where((record["first_bad"] < 0) & ~finite, state["step"] + 1,
                          record["first_bad"])
        record = {"first_bad": first, "skipped": record["skipped"] + (~finite).astype(jnp.int32),
                  "streak": jnp.where(finite, 0, record["streak"] + 1)}
        return new, record, metrics

    return jax.jit(step, donate_argnums=(0, 1), compiler_options=compiler_options)


class SpikeWatch:
    """Warns when a logged loss is ``factor`` times the running median or more."""

    def __init__(self, factor: float, log, chance: float | None = None):
        self.factor, self.log, self.chance = factor, log, chance
        self.recent = collections.deque(maxlen=SPIKE_WINDOW)
        self.said_chance = False

    def seed(self, records) -> None:
        """The logged losses of ``records`` (metrics.jsonl's, kept on resume), oldest first."""
        for r in records:
            loss = r.get("loss", r.get("ce")) if "split" not in r else None
            if isinstance(loss, (int, float)) and math.isfinite(loss):
                self.recent.append(float(loss))

    def see(self, step: int, loss: float) -> None:
        if self.factor > 0 and len(self.recent) >= 3:
            median = statistics.median(self.recent)
            if median > 0 and loss >= self.factor * median:
                self.log(f"warning: loss spike at step {step}: {loss:.4g} is "
                         f"{loss / median:.1f}x the median {median:.4g} of the last "
                         f"{len(self.recent)} logged steps (train.spike_factor="
                         f"{self.factor:g}); lower train.lr or raise train.warmup_steps if it "
                         "does not come back down")
        if (self.chance and not self.said_chance and math.isfinite(loss)
                and loss >= CHANCE_MARGIN * self.chance):
            self.said_chance = True
            self.log(f"warning: loss {loss:.4g} at step {step} is {loss / self.chance:.2f}x "
                     f"a uniform guess's {self.chance:.4g}: the model predicts worse than "
                     "chance; lower train.lr (or train.clip_norm) if it does not come down")
        if loss == loss and abs(loss) != float("inf"):
            self.recent.append(loss)
