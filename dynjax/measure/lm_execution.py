"""Actual execution of sequence models: blocks executed per token, and FLOPs per forward.

Two FLOP counts, side by side and never mixed: ``compiled_flops`` (XLA's cost analysis of
an unrolled program: a scan body is counted once) and ``analytic_forward_flops`` (2 x the
matmuls' and every controller's multiply-accumulates at the shapes the program runs;
elementwise work not counted, within 5% at d_model >= 128). What each counts:
docs/performance.md (Two FLOP counts).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dynjax.measure import routing
from dynjax.models import build, dispatch, mod, moe
from dynjax.models.transformer import ModelConfig


def moe_stats(model, params, tokens):
    """An MoE model's routing per layer (what its layers sow): the fraction of token-expert
    assignments dropped, of tokens routed to the no-op expert (integrated MoDE), each
    expert's load (fraction of tokens) and whether each token's FFN ran."""
    _, sown = model.module.apply({"params": params}, tokens, None, mutable=["moe_stats"])
    return sown["moe_stats"]["stats"][0]


def executed_blocks(model, params, tokens) -> np.ndarray:
    """(B, T) int: how many blocks each token executed in one forward. MoD: dense blocks
    plus the MoD blocks it entered; MoE / integrated MoDE: blocks whose FFN ran for it (a
    token routed to the no-op expert, or dropped by every expert, skips the FFN)."""
    cfg = model.cfg
    B, T = tokens.shape
    if cfg.family == "mod":
        n_dense = cfg.n_layers - len(mod.mod_layer_ids(cfg))
        if cfg.variant == "dense":
            return np.full((B, T), cfg.n_layers)
        entered = np.asarray(routing.routing_stats(model, params, tokens)["entered"])
        return n_dense + entered.sum(axis=0)
    if cfg.family == "moe":  # attention always runs; a block counts when its FFN ran
        return np.asarray(moe_stats(model, params, tokens)["ffn_ran"]).sum(axis=0)
    depth = cfg.gates.fixed_depth if cfg.variant == "fixed_depth" else cfg.n_layers
    return np.full((B, T), depth)  # gate families execute every block they build


def execution_summary(counts: np.ndarray, n_layers: int) -> dict:
    """Mean executed blocks per token and the histogram over 0..n_layers."""
    counts = np.asarray(counts).ravel()
    hist = np.bincount(counts, minlength=n_layers + 1)
    return {"mean_executed_blocks": float(counts.mean()), "n_layers": n_layers,
            "histogram": hist.tolist(), "tokens": int(counts.size)}


def compiled_cost(fn, *args) -> dict:
    """XLA's cost analysis of ``jax.jit(fn)`` compiled for ``args``: flops and bytes
    accessed. A scan/while body is counted once: pass an unrolled program."""
    return cost_of(jax.jit(fn).lower(*args).compile())


def cost_of(compiled) -> dict:
    """Flops and bytes accessed of a compiled program (``jax.jit(f).lower(...).compile()``,
    which can then also be run: one compilation for counting and timing)."""
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per computation
        cost = cost[0]
    return {"flops": float(cost.get("flops", float("nan"))),
            "bytes_accessed": float(cost.get("bytes accessed", float("nan")))}


def compiled_flops(fn, *args) -> float:
    return compiled_cost(fn, *args)["flops"]


def _attention_flops(cfg: ModelConfig, n: int) -> int:
    """q, k, v, out projections on n tokens, and scores and values over n keys."""
    d = cfg.d_model
    return 2 * n * 4 * d * d + 2 * 2 * n * n * d


def _mlp_flops(cfg: ModelConfig, n: int) -> int:
    return 2 * n * 2 * cfg.d_model * cfg.d_ff


def _moe_ffn_flops(cfg: ModelConfig, n: int, capacity: int) -> dict:
    """MoE FFN on n tokens as the program computes it: the router, the one-hot dispatch and
    combine einsums (every token against every buffer slot), and each real expert's MLP on
    its full buffer of ``capacity`` slots, used or not (a no-op route has no buffer).
    Dropless: no dispatch einsums; the experts' MLP on the sorted layout's static rows
    (every route, padded to blocks: ``dispatch.n_rows``), used or not; dense: on every
    token."""
    d, E = cfg.d_model, cfg.moe.num_experts
    if moe.dropless(cfg):   # "dense": every expert on every token
        pairs = n * cfg.moe.num_experts_per_tok
        rows = n * E if cfg.moe.dispatch == "dense" else dispatch.n_rows(
            pairs, E, dispatch.default_block(pairs, E))
        return {"router": 2 * n * d * moe.n_routes(cfg), "experts": _mlp_flops(cfg, rows)}
    return {"router": 2 * n * d * moe.n_routes(cfg),
            "dispatch_combine": 2 * 2 * n * E * capacity * d,
            "experts": E * _mlp_flops(cfg, capacity)}


def _mod_flops(cfg: ModelConfig, T: int) -> dict:
    """Dense blocks on T tokens; each MoD block on its slots (k = floor(cT) under top-k, all
    T under causal routing, where non-entering slots are masked, not skipped), its router
    and predictor on all T; staged MoDE's MoE on the slots."""
    d, h = cfg.d_model, cfg.mod.predictor_hidden
    mod_ids = mod.mod_layer_ids(cfg)
    parts = {"dense_blocks": (cfg.n_layers - len(mod_ids))
             * (_attention_flops(cfg, T) + _mlp_flops(cfg, T))}
    if not mod_ids:
        return parts
    n = mod.capacity(cfg, T) if cfg.mod.route == "topk" else mod.decode_slots(cfg, T)
    per_block = {"mod_attention": _attention_flops(cfg, n), "router": 2 * T * d,
                 "predictor": 2 * T * (d * h + h)}
    if cfg.variant == "mode_staged":
        c = (moe.expert_capacity(cfg, n) if cfg.mod.route == "topk"
             else mod.causal_expert_capacity(cfg, n))
        per_block.update({f"moe_{k}": v for k, v in _moe_ffn_flops(cfg, n, c).items()})
    else:
        per_block["mod_mlp"] = _mlp_flops(cfg, n)
    parts.update({k: len(mod_ids) * v for k, v in per_block.items()})
    return parts


def _moe_flops(cfg: ModelConfig, T: int) -> dict:
    ffn = _moe_ffn_flops(cfg, T, moe.expert_capacity(cfg, T))
    return {"attention": cfg.n_layers * _attention_flops(cfg, T),
            **{f"moe_{k}": cfg.n_layers * v for k, v in ffn.items()}}


def _gates_flops(cfg: ModelConfig, T: int) -> dict:
    n_blocks = cfg.gates.fixed_depth if cfg.variant == "fixed_depth" else cfg.n_layers
    parts = {"blocks": n_blocks * (_attention_flops(cfg, T) + _mlp_flops(cfg, T))}
    if cfg.variant == "feature_gate":  # controller MLP on 4 features per token
        parts["controller"] = n_blocks * 2 * T * (4 * cfg.gates.controller_hidden
                                                  + cfg.gates.controller_hidden)
    return parts


def _mudd_flops(cfg: ModelConfig, T: int) -> dict:
    """Blocks, and after block i the mix of i + 2 sources into C_i streams (a multiply-add
    per element) and, for ``mudd``, the DA MLP producing those C_i * (i + 2) weights."""
    from dynjax.models import mudd
    d, h = cfg.d_model, cfg.mudd.da_hidden
    cs = [(mudd.n_streams(cfg, i), i + 2) for i in range(cfg.n_layers)]
    parts = {"blocks": cfg.n_layers * (_attention_flops(cfg, T) + _mlp_flops(cfg, T)),
             "mix": sum(2 * T * C * S * d for C, S in cs)}
    if cfg.variant == "mudd":
        parts["da_mlp"] = sum(2 * T * (d * h + h * C * S) for C, S in cs)
    return parts


FAMILY_FLOPS = {"gates": _gates_flops, "mod": _mod_flops, "moe": _moe_flops,
                "mudd": _mudd_flops}
# counted elsewhere: measure.panels.llm_flops_per_window (the llm family's parameter table),
# measure.macs (the classifier's masked MACs), measure.panels.muddpythia_execution_panel,
# DeepseekV4.sizes (measure.panels.estimate)
FLOPS_ELSEWHERE = ("llm", "gated_mlp", "muddpythia", "deepseek_v4")


def analytic_forward_flops(cfg: ModelConfig, batch: int, seq_len: int) -> dict:
    """Matmul FLOPs (2 x MACs) of one forward over (batch, seq_len), by part."""
    parts = FAMILY_FLOPS[cfg.family](cfg, seq_len)
    parts["head"] = 2 * seq_len * cfg.d_model * cfg.vocab_size
    parts = {k: batch * v for k, v in parts.items()}
    parts["total"] = sum(parts.values())
    return parts


def flop_report(cfg: ModelConfig, batch: int, seq_len: int, params=None) -> dict:
    """Compiled (unrolled program) and analytic FLOPs of one record forward."""
    cfg = cfg.replace(scan_layers=False)
    model = build(cfg)
    tokens = jnp.zeros((batch, seq_len), jnp.int32)
    if params is None:
        params = jax.eval_shape(model.init, jax.random.key(0), tokens)
    compiled = compiled_cost(lambda p, t: model.apply(p, t)[0], params, tokens)
    analytic = analytic_forward_flops(cfg, batch, seq_len)
    return {"compiled_flops": compiled["flops"],
            "compiled_bytes_accessed": compiled["bytes_accessed"],
            "compiled_counted_on": "unrolled layers "
            "(scan_layers=False), XLA cost analysis, all ops",
            "analytic_flops": analytic["total"], "analytic_parts": analytic,
            "analytic_counts": "matmuls only, 2 x MACs"}
