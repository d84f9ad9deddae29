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

import jax
import jax.numpy as jnp
import numpy as np

from dynjax.models.mod import mod_layer_ids


def _no_mass_match(config):
    if config.get("mass_match_run"):
        raise ValueError("mass_match_run is only meaningful for model.variant='uniform'")
    return config


class Hooks(NamedTuple):
    resolve: Callable = _no_mass_match   # config -> config (a plain copy, editable)
    step_metrics: Callable = lambda coeffs, cfg: {}   # (coeffs, model cfg) -> {name: array}, in jit
    log_fields: Callable = lambda metrics, cfg: {}   # (host metrics, model cfg) -> JSON fields
    compiler_options: Callable = lambda backend: None  # backend -> the train step's XLA options
    # (old params, new params, coeffs, tokens, model cfg) -> (params, metrics), in jit:
    # training rules outside the gradient, applied after each optimizer step (DeepSeek's bias
    # update), and metrics that need the parameters (the experts a router's own rule picked)
    after_update: Callable = lambda old, new, coeffs, tokens, cfg: (new, {})


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


def gate_mass(coeffs, cfg=None) -> dict:
    if "gate" not in coeffs:
        return {}
    return {"gate_mass_per_layer": coeffs["gate"].mean(axis=(1, 2))}


def gate_mass_fields(metrics, cfg=None) -> dict:
    if "gate_mass_per_layer" not in metrics:
        return {}
    return {"gate_mass_per_layer": metrics["gate_mass_per_layer"].tolist(),
            "gate_mass": float(np.mean(metrics["gate_mass_per_layer"]))}


def mod_entry_rates(coeffs, cfg) -> dict:
    """Per MoD block, the share of tokens whose router score is positive: the causal rule's
    entry rate (decoding enters a token when its logit > 0; training's top-k forward always
    takes the capacity's share, so that rate says nothing)."""
    if "router" not in coeffs:
        return {}
    return {"mod_enter_rate_per_block": (coeffs["router"] > 0).mean(axis=(1, 2))}


def mod_entry_fields(metrics, cfg, blocks=None) -> dict:
    """Keyed by the model's block numbers (``blocks``, default ``mod_layer_ids``: blocks 1,
    3, ... by default)."""
    if "mod_enter_rate_per_block" not in metrics:
        return {}
    blocks = mod_layer_ids(cfg) if blocks is None else blocks
    return {"mod_enter_rate_per_block": dict(zip(
        (str(i) for i in blocks), metrics["mod_enter_rate_per_block"].tolist()))}


def moe_load(coeffs, cfg) -> dict:
    """Per MoE layer and route, the share of the tokens' top-k router choices (1/E is
    balanced): the load each expert is asked to take."""
    if "router" not in coeffs:
        return {}
    top = jax.lax.top_k(coeffs["router"], cfg.moe.num_experts_per_tok)[1]
    return {"moe_load_per_expert": expert_shares(top, coeffs["router"].shape[-1])}


def expert_shares(chosen, num_experts: int):
    """(layer, expert) share of the routes (layer, example, token, k) each expert takes."""
    return jax.nn.one_hot(chosen, num_experts, dtype=jnp.float32).mean(axis=(1, 2, 3))


def moe_load_fields(metrics, cfg=None) -> dict:
    if "moe_load_per_expert" not in metrics:
        return {}
    return {"moe_load_per_expert": metrics["moe_load_per_expert"].tolist()}


def no_ynn_reduce_on_cpu(backend: str):
    """XLA:CPU's default YNNPACK fusions (reductions and single dots) less the reductions.

    MUDD's backward sums each source's gradient over the C streams of every later layer: a
    reduction over the outermost axis of (C, B, T, D), which the YNNPACK reduce fusion runs
    slowly. Without it the 8-layer MUDD train step takes 0.76x the time
    (``results/mudd_mix.json``); dense and FeatureGate lost 3-10% in a quick trial, so only
    MUDD asks."""
    return ({"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}
            if backend == "cpu" else None)


def llm_resolve(config):
    """The llm family's config: its architecture from ``train.init_from`` where left unset
    (``dynjax.train.init_from.fill_from_source``: a Hugging Face directory or an llm run)."""
    from dynjax.train import init_from

    return init_from.fill_from_source(_no_mass_match(config))


def llm_metrics(coeffs, cfg) -> dict:
    """The MoD layers' entry rates, as the mod family logs them (the llm family's MoD scores
    are ``mod_router``); the expert loads come from :func:`llm_after_update`."""
    if "mod_router" in coeffs:
        return mod_entry_rates({"router": coeffs["mod_router"]}, cfg)
    return {}


def llm_after_update(old, new, coeffs, tokens, cfg):
    """``dynjax.models.llm.after_update`` (a hash table kept, selection biases balanced) and
    each MoE layer's expert loads as the moe family logs them, counted from the experts the
    router's own rule picked (its selection bias, groups or table: not the scores' top-k)."""
    from dynjax.models import llm

    params = llm.after_update(cfg, old, new, coeffs.get("router"), tokens)
    if "router" not in coeffs:
        return params, {}
    chosen = llm.selected_experts(cfg, old, coeffs["router"], tokens)
    return params, {"moe_load_per_expert": expert_shares(chosen, cfg.num_experts)}


def llm_fields(metrics, cfg) -> dict:
    return {**mod_entry_fields(metrics, cfg, cfg.mod_layers), **moe_load_fields(metrics)}


HOOKS = {"gates": Hooks(resolve=mass_match, step_metrics=gate_mass, log_fields=gate_mass_fields),
         "mod": Hooks(step_metrics=mod_entry_rates, log_fields=mod_entry_fields),
         "moe": Hooks(step_metrics=moe_load, log_fields=moe_load_fields),
         "mudd": Hooks(compiler_options=no_ynn_reduce_on_cpu),
         "llm": Hooks(resolve=llm_resolve, step_metrics=llm_metrics, log_fields=llm_fields,
                      after_update=llm_after_update),
         "gated_mlp": NONE,      # the classifier trainer logs its own gate statistics
         "muddpythia": NONE,     # a reference port: loaded, never trained here
         "deepseek_v4": NONE}    # a port of a checkpoint: no training-time statistics


def hooks_of(family: str) -> Hooks:
    return HOOKS.get(family, NONE)
