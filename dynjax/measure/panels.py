"""Execution panels: what each kind of checkpoint executes, against what it is compared with.

A language model against its dense twin (executed blocks, FLOPs, KV cache, latency), a
classifier against the dense MLP of the same widths (open units, RelMAC), MUDDPythia
against the same weights with static mixing. The scorecard shows them; each kind of
checkpoint (:mod:`dynjax.runs`) says which is its own. Timers of a model and its baseline
take turns in one run (``dynjax.measure.latency``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dynjax import decoding
from dynjax.measure import execution, latency, mlp_execution
from dynjax.models import build, muddpythia
from dynjax.models.transformer import ModelConfig


def dense_twin(cfg: ModelConfig) -> ModelConfig:
    """The same-size dense decoder a dynamic model's execution is compared with."""
    if cfg.family in ("gates", "mod"):
        return cfg.replace(variant="dense")
    return ModelConfig(family="gates", variant="dense", vocab_size=cfg.vocab_size,
                       d_model=cfg.d_model, n_heads=cfg.n_heads, n_layers=cfg.n_layers,
                       d_ff=cfg.d_ff, dtype=cfg.dtype, scan_layers=cfg.scan_layers)


def execution_panel(cfg: ModelConfig, params, windows, batches=(1, 8), repeats: int = 5) -> dict:
    """Executed blocks, FLOPs, KV-cache bytes and measured forward / prefill / decode
    latency relative to the dense twin, the two models' timers taking turns in one run
    (``dynjax.measure.latency``; timing inputs are random tokens of the window length)."""
    model, twin_cfg = build(cfg), dense_twin(cfg)
    twin = build(twin_cfg)
    T = windows.shape[1]
    tokens = jnp.asarray(windows[:max(batches)])
    counts = execution.executed_blocks(model, params, tokens)
    flops = execution.flop_report(cfg, 1, T)
    twin_flops = execution.flop_report(twin_cfg, 1, T)
    twin_params = twin.init(jax.random.key(0), tokens[:1])
    kv = lambda c: decoding.cache_bytes(decoding.init_cache(c, 1, T))
    out = {"executed_blocks_per_token": float(np.mean(counts)), "n_layers": cfg.n_layers,
           "executed_fraction": float(np.mean(counts)) / cfg.n_layers,
           "flops_ratio_compiled": flops["compiled_flops"] / twin_flops["compiled_flops"],
           "flops_ratio_analytic": flops["analytic_flops"] / twin_flops["analytic_flops"],
           "kv_cache_bytes_ratio": kv(cfg) / kv(twin_cfg),
           "dense_twin": f"{twin_cfg.family}/{twin_cfg.variant}", "latency": {},
           "load_average": latency.load_average()}
    timers = {}
    for who, (c, p) in {"model": (cfg, params), "dense": (twin_cfg, twin_params)}.items():
        timers.update({f"{who}/{k}": f for k, f in latency.model_timers(c, p, T, batches).items()})
    med = latency.paired_medians(timers, repeats)
    mine = {k.split("/", 1)[1]: v for k, v in med.items() if k.startswith("model/")}
    rate = latency.rates(mine, T)
    for name, s in mine.items():
        out["latency"][name] = {"seconds": s, "dense_seconds": med[f"dense/{name}"],
                                "ratio": s / med[f"dense/{name}"], "tokens_per_s": rate[name]}
    return out


def _latency_rows(med: dict, program: str, baseline: str, batches, per_call) -> dict:
    """``forward_b{b}`` rows of ``program`` against ``baseline`` from paired medians keyed
    ``{who}/forward_b{b}``; ``per_call(b)`` is (items per call, what an item is)."""
    rows = {}
    for b in batches:
        s, base = med[f"{program}/forward_b{b}"], med[f"{baseline}/forward_b{b}"]
        n, item = per_call(b)
        rows[f"forward_b{b}"] = {"seconds": s, "dense_seconds": base, "ratio": s / base,
                                 f"{item}_per_s": n / s}
    return rows


def classifier_execution_panel(model, params, x, settings: dict, batches=(1, 8),
                               repeats: int = 50) -> dict:
    """A GatedMLP's open units per example (RelMAC), and its forward's FLOPs and latency
    against the dense MLP of the same widths; a structured model's open-blocks path beside
    it under ``structured``. ``x``: test examples (RelMAC over all, timing on the first
    max(batches)); ``settings``: the gate schedule at the checkpoint's step."""
    cfg = model.cfg
    units = mlp_execution.open_units(model, params, jnp.asarray(x), settings)
    analytic = mlp_execution.analytic_flops(cfg, units)
    compiled = mlp_execution.compiled_flops(cfg, params, settings)
    med = latency.paired_medians(mlp_execution.timers(cfg, params, x, settings, batches),
                                 repeats)

    def program(name):
        return {"flops_ratio_compiled": compiled[name] / compiled["dense"],
                "flops_ratio_analytic": analytic[name] / analytic["dense"],
                "latency": _latency_rows(med, name, "dense", batches, lambda b: (b, "examples"))}
    out = {"kind": "units", **program("model"), "relmac": units["relmac"],
           "open_units_per_example": units["open_units_per_example"], "units": units["units"],
           "executed_fraction": units["executed_fraction"],
           "compiled_flops_per_example": compiled, "analytic_flops_per_example": analytic,
           "dense_twin": "gated_mlp/dense " + "-".join(map(str, model.dims)),
           "load_average": latency.load_average()}
    if "structured" in compiled:
        out["structured"] = program("structured")
    return out


def muddpythia_execution_panel(cfg, params, windows, batches=(1, 8), repeats: int = 5) -> dict:
    """MUDDPythia runs every block for every token (no skipping); its forward's FLOPs
    (compiled, and analytic from ``muddpythia.memory_time_estimate``) and latency, timed in
    turns, against ``muddpythia.apply_static_mixing``: the same weights, no DA MLP."""
    T = windows.shape[1]
    programs = {"model": lambda p, t: muddpythia.apply(cfg, p, t)[0],
                "static": lambda p, t: muddpythia.apply_static_mixing(cfg, p, t)[0]}
    one = jnp.asarray(windows[:1])
    compiled = {k: execution.compiled_cost(f, params, one)["flops"] for k, f in programs.items()}
    est = muddpythia.memory_time_estimate(cfg, 1, T, 1)
    timers = {}
    for name, f in programs.items():
        jitted = jax.jit(f)
        for b in batches:
            tokens = jnp.asarray(windows[:b])
            timers[f"{name}/forward_b{b}"] = lambda f=jitted, t=tokens: f(params, t)
    med = latency.paired_medians(timers, repeats)
    return {"kind": "mixing", "executed_blocks_per_token": float(cfg.n_layer),
            "n_layers": cfg.n_layer, "executed_fraction": 1.0,
            "flops_ratio_compiled": compiled["model"] / compiled["static"],
            "flops_ratio_analytic": est["record_flops_per_window"]
            / est["static_mixing_flops_per_window"],
            "compiled_flops": compiled,
            "dense_twin": "the same weights with static mixing (dense_bs only, no DA MLP)",
            "baseline": "static mixing",
            "latency": _latency_rows(med, "model", "static", batches,
                                     lambda b: (b * T, "tokens")),
            "load_average": latency.load_average()}
