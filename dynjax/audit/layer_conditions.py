"""Routing conditions one layer at a time: is layer l's routing a token-id lookup or a
function of context? (issue 48's headline table)

Layer l's router scores alone are replaced by a condition's (``cross_input``,
``token_identity``), every other layer replays its recorded scores; ΔNLL per window against
the recorded replay over R paired reassignments, the paired difference and the share token
identity recovers. Details: docs/audit.md (Routing conditions one layer at a time).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dynjax.audit import interventions, stats

CONDITIONS = ("cross_input", "token_identity")


def per_layer(rec, conditions=CONDITIONS, reassignments: int = 5, seed: int = 0) -> dict:
    """``{condition: (L, R, W) ΔNLL}`` with only layer l's router scores under the condition."""
    base = rec.nll_given(rec.full())
    full = rec.full()
    schema = {"router": rec.model.schema["router"]}
    keys = jax.random.split(jax.random.key(seed), reassignments)
    out = {}
    for name in conditions:
        delta = np.zeros((rec.n_layers, reassignments, len(base)))
        for r, key in enumerate(keys):
            changed = interventions.apply_condition(
                name, {"router": full["router"]}, schema, key=key,
                tokens=jnp.asarray(rec.windows))["router"]
            for layer in range(rec.n_layers):
                router = full["router"].at[layer].set(changed[layer])
                delta[layer, r] = rec.nll_given(dict(full, router=router)) - base
        out[name] = delta
    return out


def summarize(delta: dict, level: float = 0.95, seed: int = 0, n_resamples: int = 9999) -> list:
    """Per layer: each condition's ΔNLL and token_identity - cross_input, with window x
    reassignment CIs (one checkpoint)."""
    rows = []
    for layer in range(delta["cross_input"].shape[0]):
        ci, ti = delta["cross_input"][layer], delta["token_identity"][layer]
        rows.append({"layer": layer,
                     "cross_input": stats.summarize_windows(ci, level, seed, n_resamples),
                     "token_identity": stats.summarize_windows(ti, level, seed, n_resamples),
                     "difference": stats.summarize_windows(ti - ci, level, seed, n_resamples)})
    return rows
