"""What a GatedMLP classifier actually executes, against the dense MLP of the same widths.

Three programs kept apart: the model's own masked forward (every unit, plus its
controllers: more than dense), the ``structured`` variant's gathered forward of open blocks
alone, and the dense twin. Analytic counts are 2 x MACs in :mod:`dynjax.measure.macs`'
terms; compiled counts are XLA's cost analysis of each jitted program. Details:
docs/performance.md (What a GatedMLP executes).
"""
from __future__ import annotations


import jax
import jax.numpy as jnp

from dynjax.measure import macs
from dynjax.models import FAMILIES
from dynjax.models.gated_mlp import GatedMLP, MLPConfig, structured_forward


def dense_twin(cfg: MLPConfig) -> MLPConfig:
    """The dense MLP of the same widths that a gated one's execution is compared with."""
    return FAMILIES["gated_mlp"].dense_twin(cfg)


def has_structured_path(cfg: MLPConfig) -> bool:
    return cfg.variant == "structured"


def open_units(model: GatedMLP, params, x, settings: dict) -> dict:
    """RelMAC (:func:`dynjax.measure.macs.report`) of the masked forward on examples ``x``
    at the gate settings (tau, theta, gates_open), plus the mean open units per example
    of each hidden layer and their share of all hidden units."""
    _, _, aux = jax.jit(lambda p, x: model.apply(p, x, with_aux=True, **settings))(params, x)
    rep = macs.report(model.dims, macs.model_mac_sums(model, aux["open"]), x.shape[0])
    units = list(model.cfg.hidden)
    per_layer = [float(r * n) for r, n in zip(rep["open_rate_per_layer"], units)]
    return {**rep, "open_units_per_example": per_layer, "units": units,
            "executed_fraction": sum(per_layer) / sum(units)}


def analytic_flops(cfg: MLPConfig, relmac_report: dict) -> dict:
    """2 x MACs per example: dense, the model's masked forward (all weights + controllers on all
    inputs) and, for structured models, the open-blocks path (the RelMAC numerator)."""
    model = GatedMLP(cfg)
    dense = float(sum(a * b for a, b in zip(model.dims[:-1], model.dims[1:])))
    ctrl = 0.0
    for n_in, c in zip(model.dims[:-1], macs.controllers(cfg)):
        if c is not None:
            r, m = c
            ctrl += n_in * r + r * m if r else n_in * m
    out = {"dense": 2 * dense, "model": 2 * (dense + ctrl)}
    if has_structured_path(cfg):
        out["structured"] = 2 * relmac_report["macs_per_example"]
    return out


def forward_fns(cfg: MLPConfig, settings: dict) -> dict:
    """name -> f(params, x) -> logits of each program this model can run: "model" (its own
    forward; masked for gated variants) and "structured" where it exists."""
    model = GatedMLP(cfg)
    out = {"model": lambda p, x: model.apply(p, x, **settings)[0]}
    if has_structured_path(cfg):
        out["structured"] = lambda p, x: structured_forward(cfg, p, x)
    return out


def programs(cfg: MLPConfig, params, x, settings: dict) -> dict:
    """name -> (f(params, x) -> logits, its params) of every program (model, structured where
    it exists) and of the dense twin as "dense" (random weights: its cost does not depend on
    their values); time and count them with :func:`dynjax.measure.latency.compiled_forward_timers`."""
    twin = dense_twin(cfg)
    twin_params = GatedMLP(twin).init(jax.random.key(0), jnp.asarray(x[:1]))
    return {**{k: (f, params) for k, f in forward_fns(cfg, settings).items()},
            "dense": (forward_fns(twin, {})["model"], twin_params)}
