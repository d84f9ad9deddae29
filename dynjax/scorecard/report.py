"""The scorecard's files: scorecard.json, scorecard.md and one figure per checkpoint."""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from dynjax.audit.report import _save_fig, dnll_axis, to_jsonable
from dynjax.jsonio import write_json_atomic, write_text_atomic


def run_name(card: dict) -> str:
    """A checkpoint's name for titles and tables: its folder's name, not its path."""
    return Path(str(card["run"])).name or str(card["run"])


def forward_measured(card: dict) -> str:
    """Which forward the dependence row audited and the execution panel timed."""
    if card.get("forward"):
        return card["forward"]
    family, _, variant = card["model"].partition("/")
    if family == "mod" and variant != "dense":
        return ("dependence: the top-k forward (non-causal: a block takes the window's "
                "top-k router scores, as in training); execution: forward and prefill time "
                "that top-k forward, decode the causal KV-cache rule")
    if family == "gated_mlp":
        return "dependence and execution: the masked per-example forward (no token order)"
    return ("dependence and execution: the model's causal forward (each token sees earlier "
            "ones only); decode: the KV-cache decoder")


def render_markdown(cards: list) -> str:
    lines = ["# Execution scorecard", "",
             "| checkpoint | model | variation | functional dependence | execution |",
             "|---|---|---|---|---|"]
    for c in cards:
        v = c["verdicts"]
        lines.append(f"| {run_name(c)} | {c['model']} | {v['variation']} | {v['dependence']} | "
                     f"{v['execution']} |")
    lines += ["", "Thresholds (configs/scorecard.py): " + ", ".join(
        f"{k} = {val}" for k, val in cards[0]["thresholds"].items()), ""]
    for c in cards:
        ex = c["execution"]
        lines += [f"## {run_name(c)} ({c['model']}, {c['params']:,} parameters)", "",
                  f"Run: `{c['run']}`. Forward measured: {forward_measured(c)}.", ""]
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
    """Three panels: variance shares, ΔNLL with CIs, execution ratios vs dense; a panel
    with nothing to show (a dense model's variation and dependence) says so in a sentence."""
    fig = Figure(figsize=(14, 4.6), layout="constrained")
    ax1, ax2, ax3 = fig.subplots(1, 3)
    var = (card.get("variation") or {}).get("variance", {})
    names = list(var)
    if names:
        bottom = np.zeros(len(names))
        for part in _variance_parts(var):
            vals = np.array([var[n].get(part, 0.0) for n in names], float)
            ax1.bar(names, vals, bottom=bottom, label=part)
            bottom += vals
        ax1.set_ylim(0, 1)
        ax1.set_ylabel("share of the coefficient's sum of squares")
        ax1.set_xlabel("coefficient leaf")
        ax1.tick_params(axis="x", labelrotation=30)
        ax1.legend(fontsize=7)
    else:
        _sentence(ax1, "No coefficients: this model has nothing\nthat could vary with the input.")
    ax1.set_title("variation: share of coefficient variance", fontsize=9)
    rows = (card.get("dependence") or {}).get("conditions", {})
    if rows:
        labels = [r.get("label", k) for k, r in rows.items()]
        est = np.array([r["estimate"] for r in rows.values()], float)
        err = np.array([[r["estimate"] - r["ci_low"], r["ci_high"] - r["estimate"]]
                        for r in rows.values()], float).T.reshape(2, -1)
        ax2.barh(labels, est, xerr=err, color="tab:red")
        ax2.invert_yaxis()
        dnll_axis(ax2, "x", "ΔNLL vs Correct (nats, 95% CI)")
        ax2.tick_params(axis="x", labelrotation=30)
    else:
        _sentence(ax2, "No coefficients: the output cannot\ndepend on them (no audit).")
    ax2.set_title("functional dependence", fontsize=9)
    ex = card["execution"]
    bars = {{"units": "open units", "experts": "active params"}.get(
            ex.get("kind"), "executed blocks"): ex["executed_fraction"],
            "FLOPs compiled": ex["flops_ratio_compiled"],
            "FLOPs analytic": ex["flops_ratio_analytic"],
            **{k.replace("_b", " b"): r["ratio"] for k, r in ex["latency"].items()}}
    if "structured" in ex:
        bars.update({"structured FLOPs": ex["structured"]["flops_ratio_compiled"],
                     **{"structured " + k.replace("forward_b", "b"): r["ratio"]
                        for k, r in ex["structured"]["latency"].items()}})
    ax3.bar(list(bars), list(bars.values()), color="tab:green")
    ax3.axhline(1.0, color="k", lw=0.8)
    ax3.set_ylabel("ratio to the baseline (1 = same)")
    ax3.tick_params(axis="x", labelrotation=90, labelsize=8)
    ax3.set_title("execution vs " + "\n".join(textwrap.wrap(ex["dense_twin"], 48))
                  + "\n(b1, b8: batch size)", fontsize=8)
    fig.suptitle(f"{run_name(card)} ({card['model']})", fontsize=10)
    return fig


def _sentence(ax, text: str) -> None:
    ax.axis("off")
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=9)


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
