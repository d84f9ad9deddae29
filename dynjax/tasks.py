"""What a window is and how a fixed model is scored on it: :class:`Task`, and the two tasks
dynjax audits (:data:`LM`, next-token; :data:`CLASSIFY`, an example's label). Below the
audit and its checkpoint targets, which pick one per checkpoint."""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from dynjax.models.transformer import next_token_nll


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


