"""Multiply-accumulates an MLP actually needs, given which units are open: RelMAC, defined once.

A weight costs one MAC only if it is present and both units it joins are open; the
controller (GateNet or router) is counted in full; RelMAC is their expected sum over the
dense MLP's MACs, with the per-layer open rate beside it. Every MLP-family result
(DynamicGate, structured gating, Switch-MoE, pruning, RigL) uses this one definition. The
formulas: docs/models.md (RelMAC).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def mac_sums(dims, opens, weight_masks=None, controllers=None, valid=None):
    """Summed over a batch: per-layer MACs (L,), controller MACs (L,), open units (L-1,).

    ``dims``: [n_0, ..., n_L]. ``opens``: L-1 arrays (B, n_l) of 0/1 for the hidden layers,
    or None entries for layers that are never gated. ``weight_masks``: L arrays
    (n_{l-1}, n_l) or None. ``controllers``: L entries, None or (r, m_l).
    ``valid`` (B,) 0/1 drops padding rows from every sum. Jittable; sums (not means), so
    batches of any size accumulate exactly.
    """
    L = len(dims) - 1
    batch = next(o.shape[0] for o in opens if o is not None)
    v = jnp.ones((batch,)) if valid is None else jnp.asarray(valid, jnp.float32)
    acts = [None] + list(opens) + [None]
    weight_masks = weight_masks or [None] * L
    controllers = controllers or [None] * L
    macs, ctrl = [], []
    for l in range(L):
        a_in, a_out, m = acts[l], acts[l + 1], weight_masks[l]
        k_in = jnp.full((batch,), float(dims[l])) if a_in is None else jnp.sum(
            a_in.astype(jnp.float32), axis=-1)
        k_out = jnp.full((batch,), float(dims[l + 1])) if a_out is None else jnp.sum(
            a_out.astype(jnp.float32), axis=-1)
        # Never a matmul with a constant all-ones operand: jax 0.10.2's CPU backend returns
        # inf/nan for jit(sum((ones @ m) * a)) (a fused-dot bug); these sums are exact.
        if m is None:
            per_ex = k_in * k_out
        else:
            m = m.astype(jnp.float32)
            if a_in is None and a_out is None:
                per_ex = jnp.broadcast_to(jnp.sum(m), (batch,))
            elif a_in is None:
                per_ex = a_out.astype(jnp.float32) @ jnp.sum(m, axis=0)
            elif a_out is None:
                per_ex = a_in.astype(jnp.float32) @ jnp.sum(m, axis=1)
            else:
                per_ex = jnp.sum((a_in.astype(jnp.float32) @ m) * a_out.astype(jnp.float32), -1)
        macs.append(jnp.sum(per_ex * v))
        if controllers[l] is None:
            ctrl.append(jnp.zeros(()))
        else:
            r, m_out = controllers[l]
            ctrl.append(jnp.sum((k_in * r + r * m_out if r else k_in * m_out) * v))
    open_units = [jnp.zeros(()) if o is None else jnp.sum(o.astype(jnp.float32) * v[:, None])
                  for o in opens]
    return {"macs": jnp.stack(macs), "ctrl": jnp.stack(ctrl),
            "open": jnp.stack(open_units) if open_units else jnp.zeros((0,))}


def report(dims, sums, n_examples: int) -> dict:
    """RelMAC, MAC reduction and per-layer open rates from accumulated :func:`mac_sums`.

    ``sums`` was accumulated over ``n_examples`` inputs."""
    dims = list(dims)
    dense = float(sum(a * b for a, b in zip(dims[:-1], dims[1:])))
    macs = np.asarray(sums["macs"], np.float64) / n_examples
    ctrl = np.asarray(sums["ctrl"], np.float64) / n_examples
    open_rate = np.asarray(sums["open"], np.float64) / n_examples / np.asarray(dims[1:-1])
    rel = (macs.sum() + ctrl.sum()) / dense
    return {"relmac": float(rel), "mac_reduction": float(1 - rel),
            "macs_per_example": float(macs.sum() + ctrl.sum()), "dense_macs": dense,
            "layer_macs": macs.tolist(), "controller_macs": ctrl.tolist(),
            "open_rate_per_layer": open_rate.tolist(),
            "open_rate": float(open_rate.mean()) if open_rate.size else 1.0}


def controllers(cfg) -> list:
    """(r, m_l) per weight matrix of a GatedMLP (``cfg``: its MLPConfig) for :func:`mac_sums`:
    the GateNet's bottleneck and gate count, or the MoE router (r = 0); None where no
    controller runs."""
    if cfg.variant == "dgate":
        ctrl = [(cfg.gate_hidden, n) for n in cfg.hidden]
    elif cfg.variant == "structured":
        ctrl = [(cfg.gate_hidden, n // cfg.block_size) for n in cfg.hidden]
    elif cfg.variant == "moe":
        ctrl = [(0, cfg.n_experts) for _ in cfg.hidden]
    else:
        ctrl = [None] * len(cfg.hidden)
    return ctrl + [None]


def model_mac_sums(model, opens, weight_masks=None, valid=None):
    """:func:`mac_sums` of a GatedMLP from the ``open`` masks its ``apply(with_aux=True)``
    returns, its controllers included."""
    return mac_sums(model.dims, opens, weight_masks, controllers(model.cfg), valid)
