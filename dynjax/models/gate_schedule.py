"""The DynamicGate recipe's step-dependent gate settings (``config.gate``): what a
classifier run's model computes at step s. The trainer follows it and the audit replays
the function the run's own evaluation measured, so it lives below both.

- ``warmup_steps``: gates forced open and no usage penalty (the backbone first learns as
  a dense net).
- after warm-up, over ``anneal_steps``: tau goes geometrically from ``tau_start`` to
  ``model.tau``, theta linearly from ``theta_start`` to ``model.theta``.
- ``lambda_g`` ramps linearly from 0 over ``ramp_steps`` after warm-up.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def gate_schedule(config, step):
    """(tau, theta, gates_open, lambda_g) at ``step`` (a traced int is fine)."""
    g, m = config.gate, config.model
    step = jnp.asarray(step, jnp.float32)
    t = jnp.clip((step - g.warmup_steps) / max(g.anneal_steps, 1), 0.0, 1.0)
    tau = g.tau_start * (m.tau / g.tau_start) ** t
    theta = g.theta_start + (m.theta - g.theta_start) * t
    ramp = jnp.clip((step - g.warmup_steps) / max(g.ramp_steps, 1), 0.0, 1.0)
    return {"tau": tau, "theta": theta, "gates_open": step < g.warmup_steps,
            "lambda_g": g.lambda_g * ramp}


def apply_settings(config, step: int) -> dict:
    """The model's keyword settings at ``step`` as Python values (tau, theta, gates_open)."""
    s = jax.device_get(gate_schedule(config, step))
    return {"tau": float(s["tau"]), "theta": float(s["theta"]),
            "gates_open": bool(s["gates_open"])}
