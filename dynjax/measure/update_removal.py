"""Post-training skipping of residual-gate updates, as the audit paper's execution study did.

A trained gate model records its gates ``g[l, b, t]``; two interventions remove updates and
replay the rest through the same compiled program (coefficients are data, so every tau and
every depth reuses one executable and tau = 0 is bitwise the plain forward):

- ``threshold``: zero every update whose gate is below tau. Sweeping tau traces bits/byte
  against the fraction of (layer, token) updates removed.
- ``truncate``: keep the first K blocks' updates and drop the rest (FixedDepthK applied to
  the same checkpoint), K = L .. 1, the static baseline at the same fractions.

What this does NOT show is a saving. A FeatureGate's features are computed from the
block's own attention, so a gate below tau is known only after the block has run: removing
its update saves nothing unless the decision is moved before the block (a predictor on
h[l], as Mixture-of-Depths does).
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
