"""Execution panels: what each kind of checkpoint executes, against what it is compared with.

A language model against its dense twin (executed blocks, FLOPs, KV cache, latency), a
classifier against the dense MLP of the same widths (open units, RelMAC), MUDDPythia
against the same weights with static mixing, a production MoE (``llm``) against the dense
model of the same total parameters (tokens per expert, active parameters). The scorecard
shows them; each kind of checkpoint (:mod:`dynjax.audit.targets`) says which is its own. Timers of a model and its baseline
take turns in one run (``dynjax.measure.latency``).
"""
from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from dynjax import decoding
from dynjax.measure import latency, lm_execution, mlp_execution
from dynjax.models import (FAMILIES, build, deepseek_v4, dispatch, family_of, llm,
                           muddpythia)
from dynjax.models.transformer import ModelConfig


def dense_twin(cfg: ModelConfig) -> ModelConfig:
    """The same-size dense decoder a dynamic model's execution is compared with."""
    return FAMILIES[cfg.family].dense_twin(cfg)


def execution_panel(cfg: ModelConfig, params, windows, batches=(1, 8), repeats: int = 5) -> dict:
    """Executed blocks, FLOPs, KV-cache bytes and measured forward / prefill / decode
    latency relative to the dense twin, the two models' timers taking turns in one run
    (``dynjax.measure.latency``; timing inputs are random tokens of the window length)."""
    model, twin_cfg = build(cfg), dense_twin(cfg)
    twin = build(twin_cfg)
    T = windows.shape[1]
    tokens = jnp.asarray(windows[:max(batches)])
    counts = lm_execution.executed_blocks(model, params, tokens)
    flops = lm_execution.flop_report(cfg, 1, T)
    twin_flops = lm_execution.flop_report(twin_cfg, 1, T)
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
    times = latency.paired_times(timers, repeats)
    med = {k: t["median_s"] for k, t in times.items()}
    mine = {k.split("/", 1)[1]: v for k, v in med.items() if k.startswith("model/")}
    rate = latency.rates(mine, T)
    for name, s in mine.items():
        out["latency"][name] = {"seconds": s, "dense_seconds": med[f"dense/{name}"],
                                "ratio": s / med[f"dense/{name}"], "tokens_per_s": rate[name],
                                "ratio_rounds": latency.round_ratios(
                                    times, f"model/{name}", f"dense/{name}")}
    return out


def _latency_rows(times: dict, program: str, baseline: str, batches, per_call) -> dict:
    """``forward_b{b}`` rows of ``program`` against ``baseline`` from ``paired_times`` keyed
    ``{who}/forward_b{b}`` (medians, and each round's ratio); ``per_call(b)`` is (items per
    call, what an item is)."""
    rows = {}
    for b in batches:
        name, ref = f"{program}/forward_b{b}", f"{baseline}/forward_b{b}"
        s, base = times[name]["median_s"], times[ref]["median_s"]
        n, item = per_call(b)
        rows[f"forward_b{b}"] = {"seconds": s, "dense_seconds": base, "ratio": s / base,
                                 f"{item}_per_s": n / s,
                                 "ratio_rounds": latency.round_ratios(times, name, ref)}
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
    timers, compiled = latency.compiled_forward_timers(
        mlp_execution.programs(cfg, params, x, settings), x, batches)
    times = latency.paired_times(timers, repeats)

    def program(name):
        return {"flops_ratio_compiled": compiled[name] / compiled["dense"],
                "flops_ratio_analytic": analytic[name] / analytic["dense"],
                "latency": _latency_rows(times, name, "dense", batches, lambda b: (b, "examples"))}
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
    programs = {"model": (lambda p, t: muddpythia.apply(cfg, p, t)[0], params),
                "static": (lambda p, t: muddpythia.apply_static_mixing(cfg, p, t)[0], params)}
    timers, compiled = latency.compiled_forward_timers(programs, windows, batches)
    est = muddpythia.memory_time_estimate(cfg, 1, T, 1)
    times = latency.paired_times(timers, repeats)
    return {"kind": "mixing", "executed_blocks_per_token": float(cfg.n_layer),
            "n_layers": cfg.n_layer, "executed_fraction": 1.0,
            "flops_ratio_compiled": compiled["model"] / compiled["static"],
            "flops_ratio_analytic": est["record_flops_per_window"]
            / est["static_mixing_flops_per_window"],
            "compiled_flops": compiled,
            "dense_twin": "the same weights with static mixing (dense_bs only, no DA MLP)",
            "baseline": "static mixing",
            "latency": _latency_rows(times, "model", "static", batches,
                                     lambda b: (b * T, "tokens")),
            "load_average": latency.load_average()}


# ------------------------------------------------------------------ production MoE (llm)

def llm_flops_per_window(cfg, seq_len: int, params_per_token: int) -> int:
    """Analytic forward FLOPs of one window: 2 per multiply-add of the ``params_per_token``
    matmul weights each token reads (the embedding lookup is not a matmul), plus attention
    scores and values over the full T x T square."""
    embed = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
    attn = cfg.n_layers * 2 * 2 * seq_len * seq_len * cfg.n_heads * cfg.head_dim
    return 2 * seq_len * (params_per_token - embed) + attn


def estimate(model, n_windows: int, seq_len: int, batch: int) -> dict:
    """:func:`llm_estimate`'s sizes of ``model``'s audit; a model outside the ``llm`` family
    gives its own (``model.sizes``: DeepSeek-V4)."""
    if hasattr(model, "sizes"):
        return model.sizes(n_windows, seq_len, batch)
    return llm_estimate(model.cfg, n_windows, seq_len, batch)


def llm_estimate(cfg, n_windows: int, seq_len: int, batch: int) -> dict:
    """Sizes of an audit of an ``llm`` model from its config alone (no weights): the
    parameters (all, and those one token reads), the coefficient cache of ``n_windows``,
    a rough upper bound of one forward's live activations at ``batch`` rows (the residual
    stream, one layer's expert hidden states: k sorted rows per token under the default
    dropless dispatch, with a block of padding per expert, or all E under "dense",
    the float32 scores of one attention block, the float32 logits) and the FLOPs per window
    of record and replay (one program: equal)."""
    count = llm.param_count(cfg)
    item = jnp.dtype(cfg.dtype).itemsize
    n_moe = len(cfg.moe_layers)
    per_window = seq_len * n_moe * (cfg.num_experts + (1 if cfg.shared_expert_size else 0)) * 4
    routed = cfg.num_experts if cfg.moe_dispatch == "dense" else cfg.top_k
    width = max(cfg.intermediate_size, routed * cfg.moe_intermediate_size
                + cfg.shared_expert_size)
    if cfg.moe_layers and cfg.moe_dispatch != "dense":   # the padding blocks (per batch)
        pad = dispatch.sorted_rows(batch * seq_len * cfg.top_k, cfg.num_experts) - \
            batch * seq_len * cfg.top_k
        width += -(-pad * cfg.moe_intermediate_size // (batch * seq_len))
    act = batch * seq_len * (4 * cfg.hidden_size * item + 2 * width * item
                             + cfg.vocab_size * 4)
    act += 2 * batch * cfg.n_heads * min(seq_len, cfg.attn_block or seq_len) * seq_len * 4
    flops = llm_flops_per_window(cfg, seq_len, count["active"])
    return {"param_count": count["total"], "active_param_count": count["active"],
            "param_bytes": count["total"] * item, "coeff_cache_bytes": n_windows * per_window,
            "activation_bytes_per_batch": act, "record_flops_per_window": flops,
            "replay_flops_per_window": flops}


def _same_total(make, count, total: int):
    """``make(width)`` whose ``count(cfg)["total"]`` is ``total`` (to within one width step:
    the count is linear in the width)."""
    base = count(make(1))["total"]
    per = count(make(2))["total"] - base
    return make(max(1, round(1 + (total - base) / per)))


def dense_same_total(cfg):
    """The dense ``llm`` config with the same total parameters: every layer a SwiGLU MLP
    whose width makes the count equal (to within one column of 3 x hidden parameters)."""
    dense = lambda width: dataclasses.replace(
        cfg, moe_layers=(), num_experts=0, top_k=0, moe_intermediate_size=0,
        shared_expert_size=0, norm_topk_prob=False, intermediate_size=width)
    return _same_total(dense, llm.param_count, llm.param_count(cfg)["total"])


def v4_same_total(cfg):
    """DeepSeek-V4 with one expert per layer that every token takes (no hash table), its
    width (and the shared expert's) making the total parameters equal: the same attention
    and mHC, every MLP parameter read by every token."""
    one = lambda width: dataclasses.replace(
        cfg, num_experts=1, top_k=1, mlp_layer_types=("moe",) * cfg.n_layers,
        moe_intermediate_size=width)
    return _same_total(one, deepseek_v4.param_count, deepseek_v4.param_count(cfg)["total"])


def v4_flops_per_window(cfg, seq_len: int, params_per_token: int) -> int:
    """Analytic forward FLOPs of one DeepSeek-V4 window: 2 per multiply-add of the matmul
    weights a token reads (not the embedding lookup, not the hash tables: integers), plus
    each query's scores and values over the keys it sees (its window, and the compressed
    entries: all visible ones in HCA layers, the ``index_topk`` chosen in CSA layers, whose
    indexer also scores every visible entry)."""
    t = np.arange(seq_len)
    embed = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
    tables = len(cfg.layers_of("hash_moe")) * cfg.vocab_size * cfg.top_k
    attn = 0
    for kind in cfg.layer_types:
        keys = np.minimum(t + 1, cfg.sliding_window)
        if kind == "heavily_compressed_attention":
            keys = keys + (t + 1) // cfg.hca_rate
        elif kind == "compressed_sparse_attention":
            seen = (t + 1) // cfg.csa_rate
            keys = keys + np.minimum(seen, cfg.index_topk)
            attn += 2 * int(seen.sum()) * cfg.index_n_heads * cfg.index_head_dim
        attn += 2 * 2 * int(keys.sum()) * cfg.n_heads * cfg.head_dim
    return 2 * seq_len * (params_per_token - embed - tables) + attn


@dataclasses.dataclass(frozen=True)
class MoePort:
    """What :func:`moe_execution_panel` asks a production MoE family (``MOE_PORTS``)."""

    module: ModuleType        # param_count(cfg) and init(cfg, key)
    dense_twin: Callable      # cfg -> the config of the same total parameters it is timed against
    chosen: Callable          # (cfg, params, coeffs, tokens) -> experts (moe layer, B, T, k)
    moe_layers: Callable      # cfg -> the layers that route
    flops: Callable           # (cfg, seq_len, active params) -> analytic FLOPs per window
    twin_label: Callable      # twin cfg -> what the twin is, in words
    facts: Callable = lambda cfg: {}   # cfg -> the panel's family-specific entries


MOE_PORTS = {
    "llm": MoePort(llm, dense_same_total,
                   lambda cfg, p, c, t: llm.selected_experts(cfg, p, c["router"], t),
                   lambda cfg: cfg.moe_layers, llm_flops_per_window,
                   lambda twin: f"dense llm, intermediate_size {twin.intermediate_size}"),
    "deepseek_v4": MoePort(
        deepseek_v4, v4_same_total, deepseek_v4.selected_experts,
        lambda cfg: tuple(range(cfg.n_layers)), v4_flops_per_window,
        lambda twin: f"deepseek_v4 with one expert every token takes, moe_intermediate_size "
                     f"{twin.moe_intermediate_size}",
        lambda cfg: {"hash_layers": list(cfg.layers_of("hash_moe"))}),
}


def tokens_per_expert(chosen, E: int):
    """(layer, expert) share of the routes each expert takes (rows sum to 1; 1/E is
    balanced) from the experts each MoE layer's router picked (layer, example, token, k):
    ``llm.selected_experts``, the router's own rule (a selection bias and groups
    included), not the top-k of its scores."""
    chosen = np.asarray(chosen)
    L = chosen.shape[0]
    counts = np.stack([np.bincount(chosen[i].ravel(), minlength=E) for i in range(L)])
    return counts / counts.sum(axis=1, keepdims=True)


def moe_execution_panel(cfg, params, windows, batches=(1, 8), repeats: int = 5,
                        coeffs=None) -> dict:
    """A production MoE's execution: tokens per expert per layer (load balance) on
    ``windows``; active and total parameters; FLOPs per token against the dense model of the
    same total parameters (analytic, and XLA's count of both compiled forwards: what this
    port really executes); measured forward time of both, timed in turns, beside the
    time the analytic FLOP ratio predicts. The family's pieces: ``MOE_PORTS``. ``coeffs``:
    the forward's coefficients on ``windows`` if the caller recorded them (else one more
    compiled forward)."""
    port = MOE_PORTS[family_of(cfg)]
    model, twin_cfg = build(cfg), port.dense_twin(cfg)
    twin = build(twin_cfg)
    twin_params = port.module.init(twin_cfg, jax.random.key(0))
    T = windows.shape[1]
    if coeffs is None:   # the scorecard passes the ones it recorded on these windows
        _, coeffs = jax.jit(model.apply)(params, jnp.asarray(windows))
    share = tokens_per_expert(port.chosen(cfg, params, coeffs, jnp.asarray(windows)),
                              cfg.num_experts)
    count, twin_count = port.module.param_count(cfg), port.module.param_count(twin_cfg)
    analytic = {"model": port.flops(cfg, T, count["active"]),
                "dense": port.flops(twin_cfg, T, twin_count["active"])}
    forward = lambda m: (lambda p, t: m.apply(p, t)[0])
    timers, compiled = latency.compiled_forward_timers(
        {"model": (forward(model), params), "dense": (forward(twin), twin_params)}, windows,
        batches)
    times = latency.paired_times(timers, repeats)
    rows = _latency_rows(times, "model", "dense", batches, lambda b: (b * T, "tokens"))
    for b in batches:
        rows[f"forward_b{b}"]["model_flops_per_s"] = b * analytic["model"] / \
            times[f"model/forward_b{b}"]["median_s"]
    flops_ratio = analytic["model"] / analytic["dense"]
    return {"kind": "experts", "n_layers": cfg.n_layers,
            "moe_layers": list(port.moe_layers(cfg)),
            "num_experts": cfg.num_experts, "top_k": cfg.top_k,
            "tokens_per_expert": share,
            "load_max_over_mean": (share.max(axis=1) * cfg.num_experts).tolist(),
            "active_params": count["active"], "total_params": count["total"],
            "dense_params": twin_count["total"],
            "executed_fraction": count["active"] / count["total"],
            "flops_per_token_analytic": analytic["model"] / T,
            "dense_flops_per_token_analytic": analytic["dense"] / T,
            "flops_ratio_analytic": flops_ratio,
            "flops_ratio_compiled": compiled["model"] / compiled["dense"],
            "compiled_flops_per_window": compiled,
            "predicted_time_ratio": flops_ratio,
            "dense_twin": f"{port.twin_label(twin_cfg)} ({twin_count['total']:,} parameters)",
            "baseline": "dense (same total parameters)", "latency": rows,
            "load_average": latency.load_average(), **port.facts(cfg)}
