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
report; they get the execution panel only. Each kind of checkpoint (:mod:`dynjax.runs`)
brings its own execution question (:mod:`dynjax.measure.panels`):

- DynamicGate-MLP classifiers (``train.py`` runs of ``configs/dgmlp_*.py``): open units
  per example, RelMAC, and the FLOPs and latency of the masked forward (and of the
  structured variant's open-blocks path) against the dense MLP of the same widths
  (``dynjax.measure.mlp_execution``);
- MUDDPythia HF directories: every block runs for every token; FLOPs and latency against
  the same weights with static mixing (each layer's ``dense_bs`` bias, no DA MLP);
- Hugging Face MoE directories (``scorecard.py --hf``): tokens per expert per layer, active
  parameters, FLOPs and forward time against the dense model of the same total parameters
  (docs/audit_hf.md).
"""
from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from dynjax.audit import run as audit_run
from dynjax.runs import open_target

PANEL_CONDITIONS = ("cross_input", "token_shuffle", "static_profile", "structure_removed",
                    "token_identity", "expert_relabel", "weights_flat")   # those the audit ran


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


def variation(audit: dict, coeffs: dict, cfg, schema=None, family: str | None = None) -> dict:
    """Variance shares from the audit, each leaf's input-varying share and range, and
    routing summaries, from recorded coeffs. ``family`` defaults to ``cfg.family`` (the
    decoders'; a GatedMLP or MUDDPythia config has none)."""
    family = family or cfg.family
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
    if family == "mod" and "router" in coeffs:
        out["entered_fraction_topk"] = cfg.mod.capacity
        ask = coeffs.get("predictor", coeffs["router"])
        out["asks_to_enter_fraction"] = float(np.mean(np.asarray(ask) > 0))
    if family in ("moe", "gated_mlp", "llm") and "router" in coeffs:  # MoE, MLP's Switch-MoE
        leaves = coeffs["router"] if isinstance(coeffs["router"], list) else [coeffs["router"]]
        ent = [_entropy(np.asarray(p, np.float64)) for p in leaves]
        out["routing_entropy_nats"] = float(np.mean([e.mean() for e in ent]))
        out["routing_entropy_max_nats"] = float(np.log(np.shape(leaves[0])[-1]))
    return out


def _entropy(p):
    return -np.sum(p * np.log(np.clip(p, 1e-12, None)), axis=-1)


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
    lines = [_execution_verdict(ex, th, ex.get("baseline", "dense"), "")]
    if "structured" in ex:   # a faster program of the same model counts where it exists
        lines.append(_execution_verdict(ex["structured"], th, "dense", " on its open-blocks path"))
    out["execution"] = min(lines, key=_rank)   # the model's own program wins ties
    return out


VERDICT_ORDER = ("executes less", "saves FLOPs but not time", "no skipping")


def _rank(line: str) -> int:
    return next(i for i, p in enumerate(VERDICT_ORDER) if line.startswith(p))


def _execution_verdict(ex: dict, th, baseline: str, where: str) -> str:
    lat = ex["latency"].get(f"forward_b{th.latency_batch}", {}).get("ratio", float("nan"))
    saves = ex["flops_ratio_compiled"] <= th.executes_less_max_ratio
    faster = lat <= th.executes_less_max_ratio
    what = (f"executes {ex['flops_ratio_compiled']:.2f}x the FLOPs and runs {lat:.2f}x the "
            f"time of {baseline}{where} (forward, batch {th.latency_batch})")
    return ("executes less: " + what if saves and faster else
            "saves FLOPs but not time: " + what if saves else "no skipping: " + what)


# ----------------------------------------------------------------------------- program

def score(path: str, config, out_dir, log=print, kind: str | None = None) -> dict:
    """The scorecard of one checkpoint of any kind (:func:`dynjax.runs.open_target`; ``kind``
    as there): the audit (``config.audit``, as the kind adapts it) for variation and
    dependence, then the kind's execution panel; verdicts by ``config.thresholds``."""
    target = open_target(path, kind=kind, config=config.audit)
    audit_config = target.scorecard_audit_config(config)
    card = {"run": str(path), "model": target.label,
            "params": int(sum(np.prod(p.shape) for p in jax.tree.leaves(target.params))),
            **target.card_extra()}
    params = jax.device_put(target.params)   # HF weights load as host arrays
    audit = None
    if target.has_coefficients:
        log(f"{path}: auditing ({audit_config.data.eval_windows} windows, "
            f"{audit_config.reassignments} reassignments)")
        audit = audit_run.audit_from_config(audit_config, out=str(Path(out_dir) / "audit"),
                                            progress=False, log=log, targets=[target])
    data_cfg = audit_config.data.copy_and_resolve_references()
    if audit is not None and "seq_len" in audit["meta"]["windows"]:
        data_cfg.seq_len = audit["meta"]["windows"]["seq_len"]
    _, ev, _ = target.windows(data_cfg, 0, target.execution_windows(config))
    ev = target.task.prepare(ev)
    if audit is not None:
        _, coeffs = jax.jit(target.apply_fn)(params, target.task.inputs(ev))
        card["variation"] = variation(audit, coeffs, target.model.cfg, target.schema,
                                      target.family)
        card["dependence"] = dependence(audit)
    log(f"{path}: timing against {target.baseline}")
    card["execution"] = target.execution(params, ev, config)
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
        lines += _execution_lines(ex) + [""]
    return "\n".join(lines)


def _latency_lines(latency: dict, baseline: str) -> list:
    out = []
    for name, r in latency.items():
        item, digits = ("tokens", 2) if "tokens_per_s" in r else ("examples", 3)
        flops = (f", {r['model_flops_per_s']:.3g} FLOP/s by the analytic count"
                 if "model_flops_per_s" in r else "")
        out.append(f"- {name}: {r['ratio']:.3f}x {baseline} ({r['seconds'] * 1e3:.{digits}f} ms, "
                   f"{r[item + '_per_s']:.0f} {item}/s{flops})")
    return out


def _execution_lines(ex: dict) -> list:
    """The execution panel in words: what runs, FLOP ratios, then each latency ratio."""
    flops = (f"FLOPs compiled {ex['flops_ratio_compiled']:.3f}, analytic "
             f"{ex['flops_ratio_analytic']:.3f}")
    load = f"(load average {ex['load_average']} while timing)"
    kind = ex.get("kind", "blocks")
    if kind == "units":
        opened = ", ".join(f"{o:.1f} of {n}" for o, n in zip(ex["open_units_per_example"],
                                                              ex["units"]))
        lines = [f"Open units per example {opened} ({ex['executed_fraction']:.1%} of hidden "
                 f"units); RelMAC {ex['relmac']:.3f} (controllers included). The masked "
                 f"forward computes every unit and zeroes the closed ones; vs {ex['dense_twin']}:"
                 f" {flops} {load}", *_latency_lines(ex["latency"], "dense")]
        if "structured" in ex:
            st = ex["structured"]
            lines += ["", f"Structured path (only the open blocks, gathered): FLOPs compiled "
                      f"{st['flops_ratio_compiled']:.3f}, analytic {st['flops_ratio_analytic']:.3f}"
                      " of dense", *_latency_lines(st["latency"], "dense")]
        return lines
    if kind == "experts":
        share = np.asarray(ex["tokens_per_expert"])
        per_layer = "; ".join(f"layer {i}: " + " ".join(f"{v:.2f}" for v in row)
                              for i, row in zip(ex["moe_layers"], share))
        lines = [f"Each token reads {ex['active_params']:,} of {ex['total_params']:,} parameters "
                 f"({ex['executed_fraction']:.1%}: {ex['top_k']} of {ex['num_experts']} experts "
                 f"per MoE layer); vs {ex['dense_twin']}: {flops}; the analytic ratio predicts "
                 f"{ex['predicted_time_ratio']:.3f}x the dense forward time {load}",
                 f"Tokens per expert (share of routes, 1/E = {1 / ex['num_experts']:.3f} is "
                 f"balanced): {per_layer}; max/mean per layer "
                 + ", ".join(f"{v:.2f}" for v in ex["load_max_over_mean"]),
                 *_latency_lines(ex["latency"], ex["baseline"])]
        return lines
    if kind == "mixing":
        return [f"Every block runs for every token ({ex['n_layers']} of {ex['n_layers']}: no "
                f"skipping); vs {ex['dense_twin']}: {flops} {load}",
                *_latency_lines(ex["latency"], ex["baseline"])]
    return [f"Executed blocks per token {ex['executed_blocks_per_token']:.2f} of "
            f"{ex['n_layers']}; vs {ex['dense_twin']}: {flops}; KV-cache bytes "
            f"{ex['kv_cache_bytes_ratio']:.3f} {load}", *_latency_lines(ex["latency"], "dense")]


VARIANCE_ORDER = ("layer", "stream", "source", "expert", "unit", "example", "token", "residual")


def _variance_parts(var: dict) -> list:
    """Every share the audit's decomposition reports, structure first, then input, then the
    residual (``total_ss`` is a sum of squares, not a share)."""
    seen = {k for shares in var.values() for k in shares} - {"total_ss"}
    return [p for p in VARIANCE_ORDER if p in seen] + sorted(seen - set(VARIANCE_ORDER))


def plot(card: dict):
    """Three panels: variance shares, ΔNLL with CIs, execution ratios vs dense."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(13, 3.8))
    ax1, ax2, ax3 = fig.subplots(1, 3)
    var = (card.get("variation") or {}).get("variance", {})
    names = list(var)
    bottom = np.zeros(len(names))
    for part in _variance_parts(var):
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
    bars = {{"units": "open\nunits", "experts": "active\nparams"}.get(
            ex.get("kind"), "executed\nblocks"): ex["executed_fraction"],
            "FLOPs\ncompiled": ex["flops_ratio_compiled"],
            "FLOPs\nanalytic": ex["flops_ratio_analytic"],
            **{k.replace("_b", "\nb"): r["ratio"] for k, r in ex["latency"].items()}}
    if "structured" in ex:
        bars.update({"structured\nFLOPs": ex["structured"]["flops_ratio_compiled"],
                     **{"structured\n" + k.replace("forward_", ""): r["ratio"]
                        for k, r in ex["structured"]["latency"].items()}})
    ax3.bar(list(bars), list(bars.values()), color="tab:green")
    ax3.axhline(1.0, color="k", lw=0.8)
    ax3.tick_params(axis="x", labelsize=6 if len(bars) > 6 else 8)
    ax3.set_title(f"execution: relative to\n{ex['dense_twin']}", fontsize=8)
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
