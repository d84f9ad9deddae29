"""The scorecard's files: scorecard.json, scorecard.md and one figure per checkpoint."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from dynjax.audit.report import _save_fig, to_jsonable
from dynjax.jsonio import write_json_atomic, write_text_atomic


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
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clean = to_jsonable(cards)
    write_json_atomic(out / "scorecard.json", {"command": command, "cards": clean})
    write_text_atomic(out / "scorecard.md", render_markdown(clean))
    for i, card in enumerate(clean):
        _save_fig(plot(card), out / f"scorecard_{i}.png")
