"""Fitting and scoring ``dynjax.decoding.predicted_skip``'s predictors on a frozen FeatureGate checkpoint.

Each block's predictor learns "gate[l, t] >= tau" from h[l, t] of the plain forward (BCE,
Adam, all blocks at once; the model frozen); a block's slots are a quantile of the
per-window askers. Costs are analytic matmul FLOPs of the program that runs
(:mod:`dynjax.measure.lm_execution`'s conventions). Details: docs/decoding.md (Fitting
the skip predictors).
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from dynjax.decoding import predicted_skip
from dynjax.measure.lm_execution import _attention_flops, _mlp_flops
from dynjax.measure.routing import classification
from dynjax.models import mod
from dynjax.models.transformer import next_token_nll

LN2 = math.log(2.0)


def _batches(windows, batch_size):
    for lo in range(0, len(windows), batch_size):
        yield jnp.asarray(windows[lo:lo + batch_size])


def record(cfg, params, windows, batch_size: int = 32):
    """Every block's input h (layers, N, T, d) and gate (layers, N, T) under the plain
    forward (``predicted_skip.forward`` with every token asking), as numpy."""
    fwd = jax.jit(lambda p, t: predicted_skip.forward(cfg, p, None, t, keep_inputs=True)[1])
    hs, gs = [], []
    for tokens in _batches(windows, batch_size):
        info = fwd(params, tokens)
        hs.append(np.asarray(info["h"]))
        gs.append(np.asarray(info["gate"]))
    return np.concatenate(hs, axis=1), np.concatenate(gs, axis=1)


def fit_predictor(h, gates, tau: float, hidden: int = 32, steps: int = 300,
                  batch: int = 2048, lr: float = 3e-3, seed: int = 0):
    """Stacked ``mod.Predictor`` params (one per block) fitted to ``gates >= tau`` from
    ``h`` (layers, N, T, d); returns (params, final mean BCE per block)."""
    L, d = h.shape[0], h.shape[-1]
    x = jnp.asarray(h.reshape(L, -1, d))
    y = jnp.asarray((gates >= tau).reshape(L, -1), jnp.float32)
    net = mod.Predictor(hidden)
    keys = jax.random.split(jax.random.key(seed), L + 1)
    params = jax.vmap(lambda k: nn.meta.unbox(net.init(k, x[0, :1])["params"]))(keys[:L])
    opt = optax.adam(lr)

    def loss(p, xb, yb):  # per block: mean BCE of its own tokens
        logit = jax.vmap(lambda pl, xl: net.apply({"params": pl}, xl))(p, xb)
        return optax.sigmoid_binary_cross_entropy(logit, yb).mean(-1)

    @jax.jit
    def step(carry, key):
        p, s = carry
        rows = jax.random.randint(key, (batch,), 0, x.shape[1])
        value, grad = jax.value_and_grad(lambda p: loss(p, x[:, rows], y[:, rows]).sum())(p)
        upd, s = opt.update(grad, s, p)
        return (optax.apply_updates(p, upd), s), value

    carry = (params, opt.init(params))
    for key in jax.random.split(keys[L], steps):
        carry, _ = step(carry, key)
    params = carry[0]
    final = np.asarray(jax.jit(loss)(params, x[:, :batch * 4], y[:, :batch * 4]))
    return params, final


def asked_counts(cfg, predictor, h):
    """(layers, N): askers per window of each block on recorded inputs h (layers, N, T, d)."""
    ask = jax.jit(jax.vmap(lambda p, x: predicted_skip.asks(cfg, p, x)))(predictor, jnp.asarray(h))
    return np.asarray(ask).sum(-1)


def capacity_slots(counts, seq_len: int, quantile: float = 0.9) -> list:
    """Per block: the ``quantile`` of its per-window askers (at least 1, at most T)."""
    q = np.ceil(np.quantile(counts, quantile, axis=1)).astype(int)
    return [int(min(max(s, 1), seq_len)) for s in q]


def skip_flops(cfg, seq_len: int, slots, hidden: int) -> dict:
    """Analytic matmul FLOPs of one window of ``dynjax.decoding.predicted_skip.forward`` with ``slots``."""
    d, c = cfg.d_model, cfg.gates.controller_hidden
    parts = {"predictors": cfg.n_layers * 2 * seq_len * (d * hidden + hidden),
             "blocks": sum(_attention_flops(cfg, n) + _mlp_flops(cfg, n) for n in slots),
             "controller": sum(2 * n * (4 * c + c) for n in slots),
             "head": 2 * seq_len * d * cfg.vocab_size}
    parts["total"] = sum(parts.values())
    return parts


def evaluate(cfg, params, predictor, slots, windows, tau: float, batch_size: int = 32,
             recorded=None) -> dict:
    """Test bits/byte of the skipping forward, the fraction of (block, token) executions
    run, asked and overflowed, and the predictor against ``gate >= tau`` on the plain
    forward's inputs (``recorded`` = record(...) of the same windows)."""
    fwd = jax.jit(lambda p, pr, t: predicted_skip.forward(cfg, p, pr, t, slots))
    nll = 0.0
    asked = entered = 0
    for tokens in _batches(windows, batch_size):
        logits, info = fwd(params, predictor, tokens)
        nll += float(next_token_nll(logits, tokens).mean(-1).sum())
        asked += np.asarray(info["asked"]).sum(axis=(1, 2))
        entered += np.asarray(info["entered"]).sum(axis=(1, 2))
    n, T = windows.shape
    out = {"tau": float(tau), "slots": list(slots), "bpb": nll / n / LN2,
           "executed": float(np.sum(entered)) / (cfg.n_layers * n * T),
           "executed_per_block": (np.asarray(entered) / (n * T)).tolist(),
           "overflow": float(np.sum(asked) - np.sum(entered)) / (cfg.n_layers * n * T)}
    if recorded is not None:
        h, g = recorded
        ask = jax.jit(jax.vmap(lambda p, x: predicted_skip.asks(cfg, p, x)))(predictor, jnp.asarray(h))
        out["predictor_vs_gate"] = classification(np.asarray(ask), g >= tau)
    return out
