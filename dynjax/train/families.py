"""Training hooks that belong to one language-model family, so the LM task stays generic.

A family may resolve config fields only it understands (the gates family's mass-matched
uniform gate), add metrics of its coefficients to the train step (gate mass per layer)
and turn them into log fields, and compile its train step with its own XLA options (MUDD on
the CPU). Families without hooks get :data:`NONE`.
"""
from __future__ import annotations

import json
import pathlib
from typing import Callable, NamedTuple

import numpy as np


def _no_mass_match(config):
    if config.get("mass_match_run"):
        raise ValueError("mass_match_run is only meaningful for model.variant='uniform'")
    return config


class Hooks(NamedTuple):
    resolve: Callable = _no_mass_match   # config -> config (a plain copy, editable)
    step_metrics: Callable = lambda coeffs: {}   # coeffs -> {name: array}, inside jit
    log_fields: Callable = lambda metrics: {}    # host metrics -> {name: JSON value}
    compiler_options: Callable = lambda backend: None  # backend -> the train step's XLA options


NONE = Hooks()


def mass_match(config):
    """``mass_match_run``: fix the uniform gate to a finished gated run's validation gate
    mass, so the two execute the same average update."""
    if not config.get("mass_match_run"):
        return config
    if config.model.variant != "uniform":
        return _no_mass_match(config)
    eval_path = pathlib.Path(config.mass_match_run) / "eval.json"
    if not eval_path.exists():
        raise ValueError(f"mass_match_run={config.mass_match_run!r} has no eval.json; "
                         "point it at a finished feature_gate run directory")
    mass = json.loads(eval_path.read_text())["validation"].get("gate_mass")
    if mass is None:
        raise ValueError(f"{eval_path} reports no gate mass; mass matching needs a gated run")
    config.model.uniform_value = float(mass)
    return config


def gate_mass(coeffs) -> dict:
    if "gate" not in coeffs:
        return {}
    return {"gate_mass_per_layer": coeffs["gate"].mean(axis=(1, 2))}


def gate_mass_fields(metrics) -> dict:
    if "gate_mass_per_layer" not in metrics:
        return {}
    return {"gate_mass_per_layer": metrics["gate_mass_per_layer"].tolist(),
            "gate_mass": float(np.mean(metrics["gate_mass_per_layer"]))}


def no_ynn_reduce_on_cpu(backend: str):
    """XLA:CPU's default YNNPACK fusions (reductions and single dots) less the reductions.

    MUDD's backward sums each source's gradient over the C streams of every later layer: a
    reduction over the outermost axis of (C, B, T, D), which the YNNPACK reduce fusion runs
    slowly. Without it the 8-layer MUDD train step takes 0.76x the time
    (``results/mudd_mix.json``); dense and FeatureGate lost 3-10% in a quick trial, so only
    MUDD asks."""
    return ({"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}
            if backend == "cpu" else None)


HOOKS = {"gates": Hooks(resolve=mass_match, step_metrics=gate_mass, log_fields=gate_mass_fields),
         "mudd": Hooks(compiler_options=no_ynn_reduce_on_cpu)}


def hooks_of(family: str) -> Hooks:
    return HOOKS.get(family, NONE)
