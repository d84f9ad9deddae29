"""The scorecard's files: scorecard.json, scorecard.md and one figure per checkpoint."""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from dynjax import figures as style
from dynjax.audit.report import dnll_axis, to_jsonable
from dynjax.jsonio import portable, versions, write_json_atomic, write_text_atomic


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
            fams = c["dependence"].get("families") or {}
            if fams:
                lines += ["Per coefficient family (conditions on that family only, the others "
                          "replayed as recorded):", "",
                          "| family | variation | functional dependence | cross-input ΔNLL | "
                          "LayerMean ΔNLL |", "|---|---|---|---|---|"]
                for fam, d in fams.items():
                    v = c["verdicts"]["families"][fam]
                    cells = [f"{r['estimate']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}]"
                             if (r := d["conditions"].get(n)) else "—"
                             for n in ("cross_input", "static_profile")]
                    lines.append(f"| {fam} | {v['variation']} | {v['dependence']} | "
                                 f"{cells[0]} | {cells[1]} |")
                lines.append("")
        lines += _execution_lines(ex) + [""]
    return "\n".join(lines)


def _latency_lines(latency: dict, baseline: str) -> list:
    out = []
    for name, r in latency.items():
        item, digits = ("tokens", 2) if "tokens_per_s" in r else ("examples", 3)
        flops = (f", {r['model_flops_per_s']:.3g} FLOP/s by the analytic count"
                 if "model_flops_per_s" in r else "")
        rounds = r.get("ratio_rounds")
        spread = (f"; {min(rounds):.3f}-{max(rounds):.3f} over {len(rounds)} rounds"
                  if rounds else "")
        ms = f"{r['seconds'] * 1e3:.{digits}f}"
        out.append(f"- {name}: {r['ratio']:.3f}x {baseline}{spread} ({ms} ms, "
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
            f"{ex['n_layers']}; vs {baseline_label(ex)}: {flops}; KV-cache bytes "
            f"{ex['kv_cache_bytes_ratio']:.3f} {load}", *_latency_lines(ex["latency"], "dense")]


VARIANCE_ORDER = ("layer", "stream", "source", "expert", "unit", "example", "token", "residual")


def _variance_parts(var: dict) -> list:
    """Every share the audit's decomposition reports, structure first, then input, then the
    residual (``total_ss`` is a sum of squares, not a share)."""
    seen = {k for shares in var.values() for k in shares} - {"total_ss"}
    return [p for p in VARIANCE_ORDER if p in seen] + sorted(seen - set(VARIANCE_ORDER))


def leaf_name(key: str) -> str:
    """A coefficient leaf's path as a reader writes it: ``['gate']`` -> ``gate``,
    ``['mix'][0]`` -> ``mix[0]``."""
    return key.replace("['", ".").replace("']", "").lstrip(".")


def baseline_label(ex: dict) -> str:
    """What the execution ratios divide by, in words: the twin an LM is timed against is
    the dense decoder of the same widths, whatever family its config names."""
    twin = ex["dense_twin"]
    return "the dense decoder of the same widths" if twin.endswith("/dense") else twin


def execution_rows(ex: dict) -> list:
    """(label, ratio, low, high, timed) of the execution panel: the counted fractions (no
    spread), then each latency ratio with the range of its per-round ratios where the
    rounds were recorded (NaN otherwise)."""
    counted = [({"units": "open units", "experts": "active params"}.get(
                ex.get("kind"), "executed blocks"), ex["executed_fraction"]),
               ("FLOPs compiled", ex["flops_ratio_compiled"]),
               ("FLOPs analytic", ex["flops_ratio_analytic"])]
    timed = [(k.replace("_b", " b"), r) for k, r in ex["latency"].items()]
    if "structured" in ex:
        counted.append(("structured FLOPs", ex["structured"]["flops_ratio_compiled"]))
        timed += [("structured " + k.replace("forward_b", "b"), r)
                  for k, r in ex["structured"]["latency"].items()]
    rows = [(name, v, np.nan, np.nan, False) for name, v in counted]
    for name, r in timed:
        rounds = r.get("ratio_rounds") or []
        lo, hi = (min(rounds), max(rounds)) if rounds else (np.nan, np.nan)
        rows.append((name, r["ratio"], lo, hi, True))
    return rows


@style.styled
def plot(card: dict):
    """Three panels: variance shares (stacked bars, linear 0-1), ΔNLL as dots with CIs on
    the symlog axis, execution ratios to the baseline as dots on a log axis with the spread
    over timing rounds and a band of ratios the verdict does not tell from 1. A panel with
    nothing to show (a dense model's variation and dependence) says so in a sentence."""
    fig = Figure(figsize=(14, 4.8), layout="constrained")
    ax1, ax2, ax3 = fig.subplots(1, 3)
    var = (card.get("variation") or {}).get("variance", {})
    names = list(var)
    if names:
        bottom = np.zeros(len(names))
        for part in _variance_parts(var):
            vals = np.array([var[n].get(part, 0.0) for n in names], float)
            ax1.bar([leaf_name(n) for n in names], vals, bottom=bottom, label=part)
            bottom += vals
        ax1.set_ylim(0, 1)
        ax1.set_ylabel("share of the coefficient's sum of squares")
        ax1.set_xlabel("coefficient leaf")
        ax1.tick_params(axis="x", labelrotation=30)
        ax1.legend()
    else:
        _sentence(ax1, "No coefficients: this model has nothing\nthat could vary with the input.")
    ax1.set_title("variation: share of coefficient variance")
    rows = (card.get("dependence") or {}).get("conditions", {})
    if rows:
        est, lo, hi = (np.array([r[k] for r in rows.values()], float)
                       for k in ("estimate", "ci_low", "ci_high"))
        dnll_axis(ax2, "x", "ΔNLL vs Correct (nats, 95% CI)")
        style.dot_ci(ax2, [r.get("label", k) for k, r in rows.items()], est, lo, hi,
                     color="tab:red")
        style.fit(ax2, "x", [est, lo, hi], include=[0.0])
        ax2.tick_params(axis="x", labelrotation=30)
    else:
        _sentence(ax2, "No coefficients: the output cannot\ndepend on them (no audit).")
    ax2.set_title("functional dependence")
    ex = card["execution"]
    _execution_panel(ax3, execution_rows(ex),
                     (card.get("thresholds") or {}).get("executes_less_max_ratio", 0.9))
    ax3.set_title("execution vs " + "\n".join(textwrap.wrap(baseline_label(ex), 44)))
    fig.suptitle(f"{run_name(card)} ({card['model']})")
    return fig


def _execution_panel(ax, rows, threshold: float) -> None:
    """Dots on a log axis (a ratio of 0.5 is as far from 1 as 2); whiskers span the
    per-round ratios; the band is (threshold, 1/threshold)."""
    labels = [r[0] for r in rows]
    y = np.arange(len(rows))
    ax.set_xscale("log")
    ax.axvspan(threshold, 1 / threshold, color="0.88", zorder=0,
               label=f"{threshold:g}-{1 / threshold:.3g}: not told from 1 "
                     "(the verdict's threshold)")
    ax.axvline(1.0, color="k", lw=0.8)
    for timed, marker, color, what in ((False, "D", "tab:blue", "counted (no spread)"),
                                       (True, "o", "tab:green", "timed: median ratio")):
        pick = [i for i, r in enumerate(rows) if r[4] == timed]
        if not pick:
            continue
        v, lo, hi = (np.array([rows[i][j] for i in pick], float) for j in (1, 2, 3))
        err = np.stack([np.where(np.isfinite(lo), v - lo, 0.0),
                        np.where(np.isfinite(hi), hi - v, 0.0)])
        ax.errorbar(v, y[pick], xerr=err, fmt=marker, color=color, capsize=3, label=what)
    ax.set_yticks(y, labels)
    ax.set_ylim(len(rows) + 1.9, -0.6)   # inverted, with room below the rows for the legend
    spread = [r for r in rows if r[4] and np.isfinite(r[2])]
    ax.set_xlabel("ratio to the baseline (log scale; 1 = same)\nb1, b8: batch size; "
                  + ("whiskers: range over rounds" if spread else "rounds not recorded"))
    style.fit(ax, "x", [[r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]],
              include=[threshold, 1 / threshold])
    style.plain_log_ticks(ax, "x")
    ax.legend(loc="lower center")


def _sentence(ax, text: str) -> None:
    ax.axis("off")
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center")


def write(cards: list, out_dir, command: str = "") -> None:
    """scorecard.json ({command, versions, cards}), scorecard.md and one figure per
    checkpoint, each written atomically; runs named as :func:`dynjax.jsonio.portable`
    names them, never by this machine's absolute path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    clean = portable(to_jsonable(cards))
    write_json_atomic(out / "scorecard.json",
                      {"command": portable(command), "versions": versions(), "cards": clean})
    write_text_atomic(out / "scorecard.md", render_markdown(clean))
    for i, card in enumerate(clean):
        style.save(plot(card), out / f"scorecard_{i}.png")
