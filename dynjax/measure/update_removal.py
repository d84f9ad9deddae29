"""Post-training skipping of residual-gate updates, as the audit paper's execution study did.

A gate model's recorded gates are replayed with updates removed (``threshold``: gates below
tau; ``truncate``: every block after the first K), one compiled program for every tau and
K. It shows what removal costs, not a saving: a FeatureGate's gate is known only after its
block ran (the saving needs a decision before the block: :mod:`dynjax.decoding.
predicted_skip`). Details: docs/audit.md (Post-training update removal).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from dynjax.models.transformer import next_token_nll

LN2 = math.log(2.0)


def threshold(gates, tau):
    """Gates below tau set to 0 (their updates removed); the rest unchanged."""
    return jnp.where(gates < tau, jnp.zeros_like(gates), gates)


def truncate(gates, depth):
    """Only the first ``depth`` layers' updates kept."""
    keep = jnp.arange(gates.shape[0]) < depth
    return jnp.where(keep[:, None, None], gates, jnp.zeros_like(gates))


def _batches(windows, batch_size):
    for lo in range(0, len(windows), batch_size):
        yield jnp.asarray(windows[lo:lo + batch_size])


def skipping_curves(model, params, windows, taus, batch_size: int = 32) -> dict:
    """Bits/byte and fraction of updates removed for each tau and each depth K.

    Gates are recorded once per batch; the replay program (one compilation) then runs
    every intervention. Returns {"plain", "threshold": [...], "truncate": [...]}.
    """
    if "gate" not in model.schema:
        raise ValueError(f"{model.cfg.family}/{model.cfg.variant} has no gate coefficients "
                         "to threshold; use a uniform, layer_static or feature_gate run")
    record = jax.jit(lambda p, t: model.apply(p, t))
    replay_nll = jax.jit(lambda p, t, g: next_token_nll(
        model.apply(p, t, {"gate": g})[0], t).mean(-1))
    n_layers = model.cfg.n_layers
    sums = {"plain": 0.0, "tau": np.zeros(len(taus)), "depth": np.zeros(n_layers + 1)}
    removed = np.zeros(len(taus))
    n = 0
    for tokens in _batches(windows, batch_size):
        logits, coeffs = record(params, tokens)
        g = coeffs["gate"]
        sums["plain"] += float(next_token_nll(logits, tokens).mean(-1).sum())
        for i, tau in enumerate(taus):
            sums["tau"][i] += float(replay_nll(params, tokens, threshold(g, tau)).sum())
            removed[i] += float(jnp.sum(g < tau))
        for k in range(n_layers + 1):
            sums["depth"][k] += float(replay_nll(params, tokens, truncate(g, k)).sum())
        n += tokens.shape[0]
    per_window_updates = n_layers * windows.shape[1]
    bpb = lambda s: s / n / LN2
    return {
        "windows": n, "plain_bpb": bpb(sums["plain"]),
        "threshold": [{"tau": float(t), "bpb": bpb(s),
                       "removed": float(r) / (n * per_window_updates)}
                      for t, s, r in zip(taus, sums["tau"], removed)],
        "truncate": [{"depth": k, "bpb": bpb(s), "removed": 1.0 - k / n_layers}
                     for k, s in enumerate(sums["depth"])]}


def gate_quantile_taus(model, params, windows, n: int = 12, batch_size: int = 32):
    """Taus spread over the recorded gates: 0, n quantiles, and one above every gate."""
    record = jax.jit(lambda p, t: model.apply(p, t)[1]["gate"])
    g = np.concatenate([np.asarray(record(params, t)).ravel()
                        for t in _batches(windows, batch_size)])
    qs = np.quantile(g, np.linspace(0.05, 0.95, n))
    return [0.0] + [float(q) for q in qs] + [float(g.max()) + 1.0]
