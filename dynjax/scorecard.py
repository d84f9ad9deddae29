"""The execution scorecard: three questions about one trained checkpoint, side by side.

The audit paper keeps three properties of a dynamic model apart; the scorecard answers each
for any checkpoint dynjax can load, with a one-line verdict whose threshold lives in
``configs/scorecard.py``:

- *variation*: do the coefficients change with input and position? The audit's variance
  decomposition (shares of layer / example / token / remainder), each leaf's range, and
  for routers the fraction of tokens entering or the routing entropy.
- *functional dependence*: does the fixed model's output depend on them? The audit's ΔNLL
  for cross-input, token shuffle, the static profile and the structure-removed reference,
  with intervals, and LayerMean retention — reused from ``dynjax.audit``, not recomputed.
- *execution*: does it run less? Executed blocks per token relative to all blocks, FLOPs
  relative to the same-size dense model (compiled and analytic), measured forward,
  prefill and per-token decode latency and throughput relative to that dense model at
  batch 1 and 8, KV-cache bytes.

Checkpoints without coefficients (dense, fixed_depth) have no variation or dependence to
report; they get the execution panel only.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from dynjax.measure import execution, latency
from dynjax.models import build
from dynjax.models.transformer import ModelConfig

PANEL_CONDITIONS = ("cross_input", "token_shuffle", "static_profile", "structure_removed")


def dense_twin(cfg: ModelConfig) -> ModelConfig:
    """The same-size dense decoder a dynamic model's execution is compared with."""
    if cfg.family in ("gates", "mod"):
        return dataclasses.replace(cfg, variant="dense")
    return ModelConfig(family="gates", variant="dense", vocab_size=cfg.vocab_size,
                       d_model=cfg.d_model, n_heads=cfg.n_heads, n_layers=cfg.n_layers,
                       d_ff=cfg.d_ff, dtype=cfg.dtype, scan_layers=cfg.scan_layers)


# ------------------------------------------------------------------------------ panels

INPUT_AXES = ("example", "token")


def input_share(x, names) -> float:
    """Share of a coefficient leaf's variance left after removing its static profile (the
    mean over examples and tokens of each layer / stream / source / expert cell): what
    varies with the input and position. Static structure (a layer profile, an expert or
    source pattern, their interactions) counts as not varying."""
    x = np.asarray(x, np.float64)
    axes = tuple(i for i, n in enumerate(names) if n in INPUT_AXES)
    total = float(np.sum((x - x.mean()) ** 2))
    if total == 0.0 or not axes:
        return 0.0
    return float(np.sum((x - x.mean(axis=axes, keepdims=True)) ** 2)) / total


def variation(audit: dict, coeffs: dict, cfg: ModelConfig, schema=None) -> dict:
    """Variance shares from the audit, each leaf's input-varying share and range, and
    routing summaries, from recorded coeffs."""
    from dynjax.coeffs import is_axes
    out = {"variance": audit.get("variance", {}), "ranges": {}, "input_share": {}}
    if schema is not None:
        pairs = zip(jax.tree_util.tree_flatten_with_path(coeffs)[0],
                    jax.tree.leaves(schema, is_leaf=is_axes))
        out["input_share"] = {jax.tree_util.keystr(path): input_share(x, axes.names)
                              for (path, x), axes in pairs}
    for name, leaf in coeffs.items():
        leaves = leaf if isinstance(leaf, list) else [leaf]
        vals = np.concatenate([np.asarray(v, np.float64).ravel() for v in leaves])
        out["ranges"][name] = {"min": float(vals.min()), "max": float(vals.max()),
                               "std": float(vals.std())}
    if cfg.family == "mod" and "router" in coeffs:
        out["entered_fraction_topk"] = cfg.mod_capacity
        ask = coeffs.get("predictor", coeffs["router"])
        out["asks_to_enter_fraction"] = float(np.mean(np.asarray(ask) > 0))
    if cfg.family == "moe":
        p = np.asarray(coeffs["router"], np.float64)
        ent = -np.sum(p * np.log(np.clip(p, 1e-12, None)), axis=-1)
        out["routing_entropy_nats"] = float(ent.mean())
        out["routing_entropy_max_nats"] = float(np.log(p.shape[-1]))
    return out


def dependence(audit: dict) -> dict:
    """The audit's ΔNLL rows the scorecard shows, and the static profile's retention."""
    rows = {}
    for name in PANEL_CONDITIONS:
        r = audit["conditions"].get(name)
        if r is None or r.get("not_applicable"):
            continue
        rows[name] = {k: r[k] for k in ("estimate", "ci_low", "ci_high", "p", "label")
                      if k in r}
    ret = audit["conditions"].get("static_profile", {}).get("retention")
    return {"conditions": rows, "retention": ret, "unit": audit.get("unit"),
            "replay": audit["replay"]["exact"]}


def execution_panel(cfg: ModelConfig, params, windows, batches=(1, 8), repeats: int = 5) -> dict:
    """Executed blocks, FLOPs, KV-cache bytes and measured forward / prefill / decode
    latency relative to the dense twin, the two models' timers taking turns in one run
    (``dynjax.measure.latency``; timing inputs are random tokens of the window length)."""
    from dynjax import decoding
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


# ---------------------------------------------------------------------------- verdicts

def verdicts(card: dict, th) -> dict:
    """One line per axis; the thresholds are ``th`` (configs/scorecard.py)."""
    out = {}
    var = card.get("variation")
    if var is None:
        out["variation"] = "no coefficients: nothing varies"
    else:
        share = max(var["input_share"].values(), default=float("nan"))
        out["variation"] = (f"varies (up to {share:.1%} of the variance is not its static "
                            "profile)" if share >= th.varies_min_input_share else
                            f"nearly static (its static profile explains {1 - share:.1%})")
    dep = card.get("dependence")
    if dep is None:
        out["dependence"] = "no coefficients: nothing to depend on"
    else:
        lows = {k: r["ci_low"] for k, r in dep["conditions"].items()
                if k in ("cross_input", "static_profile")}
        strongest = max(lows, key=lows.get) if lows else None
        if strongest and lows[strongest] > th.depends_min_dnll:
            out["dependence"] = (f"function depends on it ({dep['conditions'][strongest]['label']}"
                                 f" costs {dep['conditions'][strongest]['estimate']:+.4f} nats,"
                                 f" CI low {lows[strongest]:+.4f})")
        else:
            out["dependence"] = (f"little dependence (no reassignment's CI lower bound above "
                                 f"{th.depends_min_dnll} nats)")
    ex = card["execution"]
    lat = ex["latency"].get(f"forward_b{th.latency_batch}", {}).get("ratio", float("nan"))
    saves = ex["flops_ratio_compiled"] <= th.executes_less_max_ratio
    faster = lat <= th.executes_less_max_ratio
    what = (f"executes {ex['flops_ratio_compiled']:.2f}x the FLOPs and runs {lat:.2f}x the "
            f"time of dense (forward, batch {th.latency_batch})")
    out["execution"] = ("executes less: " + what if saves and faster else
                        "saves FLOPs but not time: " + what if saves else
                        "no skipping: " + what)
    return out


# ----------------------------------------------------------------------------- program

def score_run(run_dir: str, config, out_dir, log=print) -> dict:
    """The scorecard of one train.py run: audit (quick settings from ``config.audit``) for
    variation and dependence, then the execution panel; verdicts by ``config.thresholds``."""
    from pathlib import Path

    from dynjax import rundir
    from dynjax.audit import run as audit_run
    from dynjax.data import text

    cfg_run, model, params = rundir.load_params(run_dir)
    cfg = model.cfg
    dc = cfg_run.data
    splits = text.load_splits(dc.source, dc.get("path"), dc.get("tfds_name"), dc.get("data_dir"))
    windows = text.eval_windows(splits["test"], dc.seq_len, int(config.execution_windows))
    card = {"run": str(run_dir), "model": f"{cfg.family}/{cfg.variant}",
            "params": int(sum(np.prod(p.shape) for p in jax.tree.leaves(params)))}
    if model.schema:
        log(f"{run_dir}: auditing ({config.audit.data.eval_windows} windows, "
            f"{config.audit.reassignments} reassignments)")
        audit = audit_run.audit_from_config(config.audit, [run_dir],
                                            out=str(Path(out_dir) / "audit"), progress=False,
                                            log=log)
        _, coeffs = jax.jit(model.apply)(params, jnp.asarray(windows))
        card["variation"] = variation(audit, coeffs, cfg, model.schema)
        card["dependence"] = dependence(audit)
    log(f"{run_dir}: timing against its dense twin")
    card["execution"] = execution_panel(cfg, params, windows, tuple(config.latency_batches),
                                        int(config.latency_repeats))
    card["verdicts"] = verdicts(card, config.thresholds)
    card["thresholds"] = config.thresholds.to_dict()
    return card


def render_markdown(cards: list) -> str:
    lines = ["# Execution scorecard", "",
             "| checkpoint | model | variation | functional dependence | execution |",
             "|---|---|---|---|---|"]
    for c in cards:
        v = c["verdicts"]
        lines.append(f"| {c['run']} | {c['model']} | {v['variation']} | {v['dependence']} | "
                     f"{v['execution']} |")
    lines += ["", "Thresholds (configs/scorecard.py): " + ", ".join(
        f"{k} = {val}" for k, val in cards[0]["thresholds"].items()), ""]
    for c in cards:
        ex = c["execution"]
        lines += [f"## {c['run']} ({c['model']}, {c['params']:,} parameters)", ""]
        if "dependence" in c:
            lines += ["| condition | ΔNLL (nats) | 95% CI |", "|---|---|---|"]
            for name, r in c["dependence"]["conditions"].items():
                lines.append(f"| {r.get('label', name)} | {r['estimate']:+.4f} | "
                             f"[{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] |")
            ret = c["dependence"]["retention"]
            if ret:
                lines.append(f"\nStatic-profile retention of the gap to GlobalMean: "
                             f"{ret['estimate']:.1%} [{ret['ci_low']:.1%}, {ret['ci_high']:.1%}]")
            lines.append("")
        lines.append(f"Executed blocks per token {ex['executed_blocks_per_token']:.2f} of "
                     f"{ex['n_layers']}; vs {ex['dense_twin']}: FLOPs compiled "
                     f"{ex['flops_ratio_compiled']:.3f}, analytic {ex['flops_ratio_analytic']:.3f}"
                     f"; KV-cache bytes {ex['kv_cache_bytes_ratio']:.3f} (load average "
                     f"{ex['load_average']} while timing)")
        for name, r in ex["latency"].items():
            lines.append(f"- {name}: {r['ratio']:.3f}x dense ({r['seconds'] * 1e3:.2f} ms, "
                         f"{r['tokens_per_s']:.0f} tokens/s)")
        lines.append("")
    return "\n".join(lines)


def plot(card: dict):
    """Three panels: variance shares, ΔNLL with CIs, execution ratios vs dense."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(13, 3.8))
    ax1, ax2, ax3 = fig.subplots(1, 3)
    var = (card.get("variation") or {}).get("variance", {})
    names = list(var)
    bottom = np.zeros(len(names))
    for part in ("layer", "example", "token", "residual"):
        vals = np.array([var[n].get(part, 0.0) for n in names], float)
        ax1.bar(names, vals, bottom=bottom, label=part)
        bottom += vals
    ax1.set_title("variation: share of coefficient variance")
    ax1.set_ylim(0, 1)
    if names:
        ax1.legend(fontsize=7)
    rows = (card.get("dependence") or {}).get("conditions", {})
    labels = [r.get("label", k) for k, r in rows.items()]
    est = np.array([r["estimate"] for r in rows.values()], float)
    err = np.array([[r["estimate"] - r["ci_low"], r["ci_high"] - r["estimate"]]
                    for r in rows.values()], float).T.reshape(2, -1)
    ax2.barh(labels, est, xerr=err if len(est) else None, color="tab:red")
    ax2.set_xscale("symlog", linthresh=1e-3)
    ax2.set_title("functional dependence: ΔNLL (nats)")
    ex = card["execution"]
    bars = {"executed\nblocks": ex["executed_fraction"],
            "FLOPs\ncompiled": ex["flops_ratio_compiled"],
            "FLOPs\nanalytic": ex["flops_ratio_analytic"],
            **{k.replace("_b", "\nb"): r["ratio"] for k, r in ex["latency"].items()}}
    ax3.bar(list(bars), list(bars.values()), color="tab:green")
    ax3.axhline(1.0, color="k", lw=0.8)
    ax3.set_title(f"execution: relative to {ex['dense_twin']}")
    fig.suptitle(f"{card['run']} ({card['model']})", fontsize=10)
    fig.tight_layout()
    return fig


def write(cards: list, out_dir, command: str = "") -> None:
    """scorecard.json ({command, cards}), scorecard.md and one figure per checkpoint, each
    written atomically."""
    from pathlib import Path

    from dynjax.audit.report import _save_fig, to_jsonable
    from dynjax.jsonio import write_json_atomic, write_text_atomic
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clean = to_jsonable(cards)
    write_json_atomic(out / "scorecard.json", {"command": command, "cards": clean})
    write_text_atomic(out / "scorecard.md", render_markdown(clean))
    for i, card in enumerate(clean):
        _save_fig(plot(card), out / f"scorecard_{i}.png")
