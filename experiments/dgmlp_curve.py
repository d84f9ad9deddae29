"""Accuracy versus RelMAC for DynamicGate-MLP over lambda_g, beside its baselines: one command.

    .venv/bin/python experiments/dgmlp_curve.py                       # MNIST (~30 min on 2 CPU cores)
    .venv/bin/python experiments/dgmlp_curve.py --dataset=fashion_mnist

Trains (with ``train.py``, one run directory each under ``--runs``) DynamicGate at every
``--lambdas`` value, magnitude pruning at every ``--densities`` value, and dense, dropout,
Switch-MoE, RigL and DynamicGate + RigL once (each at its config's defaults); a run whose ``eval.json`` exists is not trained again, and an interrupted one
resumes from its checkpoint. Then writes ``<out>.png`` (the curve), ``<out>.json`` (every point)
and ``<out>.md`` (the table) from the runs' test-set evaluations. RelMAC is
:mod:`dynjax.measure.macs`'s definition, GateNet/router cost included.
"""
from __future__ import annotations

from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse
import json
import subprocess
import sys
from pathlib import Path

from dynjax.figures import plain_log_ticks, save, styled  # noqa: E402
from dynjax.jsonio import stamp, write_json_atomic, write_text_atomic

CONFIGS = {"mnist": "configs/dgmlp_mnist.py", "fashion_mnist": "configs/dgmlp_fashion.py",
           "pbmc68k": "configs/dgmlp_pbmc.py"}


def planned_runs(lambdas, densities) -> list[tuple[str, str, list[str]]]:
    """(name, method, overrides) for every point of the figure."""
    runs = [("dense", "dense", []), ("dropout", "dropout", []), ("moe", "moe", []),
            ("rigl", "rigl", []), ("dgate_rigl", "dgate_rigl", [])]
    runs += [(f"dgate_l{lam:g}", "dgate", [f"--config.gate.lambda_g={lam}"]) for lam in lambdas]
    runs += [(f"prune_d{d:g}", "prune", [f"--config.sparse.density={d}"]) for d in densities]
    return runs


def train_missing(dataset: str, runs_dir: Path, runs) -> None:
    for name, method, overrides in runs:
        workdir = runs_dir / name
        if (workdir / "eval.json").exists():
            continue
        cmd = [sys.executable, "train.py", f"--config={CONFIGS[dataset]}:{method}",
               f"--workdir={workdir}", "--progress=false", *overrides]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)


def collect(runs_dir: Path, runs) -> list[dict]:
    points = []
    for name, method, overrides in runs:
        with open(runs_dir / name / "eval.json") as f:
            ev = json.load(f)
        with open(runs_dir / name / "config.json") as f:
            cfg = json.load(f)
        t = ev["test"]
        points.append(dict(run=name, method=method, lambda_g=cfg["gate"]["lambda_g"]
                           if method in ("dgate", "dgate_rigl") else None,
                           density=cfg["sparse"]["density"] if method == "prune" else
                           1 - cfg["sparse"]["sparsity"] if "rigl" in method else None,
                           accuracy=t["accuracy"], relmac=t["relmac"],
                           open_rate_per_layer=t["open_rate_per_layer"],
                           validation_accuracy=ev["validation"]["accuracy"],
                           examples=t["examples"]))
    return points


LABELS = {"dense": "dense", "dropout": "dropout", "moe": "Switch-MoE (top-1)",
          "dgate": "DynamicGate", "prune": "magnitude pruning", "rigl": "RigL (ERK)",
          "dgate_rigl": "DynamicGate + RigL"}


def accuracy_ci(accuracy: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson interval of a test accuracy over n examples: how far apart two points must be."""
    from statsmodels.stats.proportion import proportion_confint

    return proportion_confint(round(accuracy * n), n, alpha=1 - level, method="wilson")


def table(points, dataset: str) -> str:
    rows = [f"Test accuracy against RelMAC on {dataset} ({points[0]['examples']} test examples; "
            "95% Wilson intervals).",
            "", "| method | λ_g / density | test acc | 95% CI | RelMAC | open rate per layer |",
            "|---|---|---|---|---|---|"]
    for p in points:
        knob = ", ".join(([f"λ_g={p['lambda_g']:g}"] if p["lambda_g"] is not None else []) +
                         ([f"density={p['density']:g}"] if p["density"] is not None else []))
        rates = " / ".join(f"{r:.2f}" for r in p["open_rate_per_layer"])
        lo, hi = accuracy_ci(p["accuracy"], p["examples"])
        rows.append(f"| {LABELS[p['method']]} | {knob} | {p['accuracy']:.2%} | "
                    f"[{lo:.1%}, {hi:.1%}] | {p['relmac']:.3f} | {rates} |")
    return "\n".join(rows) + "\n"


@styled
def plot(points, dataset: str):
    """Test accuracy against RelMAC (log), every method, the dense model's 95% CI a band."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.6, 3.9), layout="constrained")
    ax = fig.subplots()
    for p in (p for p in points if p["method"] == "dense"):  # what test-set noise allows
        lo, hi = accuracy_ci(p["accuracy"], p["examples"])
        ax.axhspan(100 * lo, 100 * hi, color="0.9", zorder=0, label="dense, 95% CI")
    for method, style in (("dgate", "o-"), ("prune", "s--")):
        pts = sorted((p for p in points if p["method"] == method), key=lambda p: p["relmac"])
        ax.plot([p["relmac"] for p in pts], [100 * p["accuracy"] for p in pts], style,
                label=LABELS[method], ms=4)
        if method == "dgate":
            for p in pts:
                ax.annotate(f"{p['lambda_g']:g}", (p["relmac"], 100 * p["accuracy"]),
                            textcoords="offset points", xytext=(3, 4), fontsize=8)
    for method, marker in (("dense", "k*"), ("dropout", "D"), ("moe", "^"), ("rigl", "v"),
                           ("dgate_rigl", "P")):
        for p in (p for p in points if p["method"] == method):
            ax.plot([p["relmac"]], [100 * p["accuracy"]], marker, label=LABELS[method], ms=7,
                    zorder=5 if method == "dense" else 3)
    ax.set_xscale("log")
    plain_log_ticks(ax, "x")   # 0.1, 0.2, 0.5, 1 rather than 10^-1
    ax.set_xlabel("RelMAC (MACs executed / dense MACs; log scale)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{dataset}: accuracy vs compute (labels: λ_g)")
    ax.grid(alpha=0.3, which="both")
    fig.legend(loc="outside right upper")
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="mnist", choices=sorted(CONFIGS))
    ap.add_argument("--lambdas", default="0,0.01,0.02,0.05,0.1,0.2,0.5,1,2",
                    help="comma-separated lambda_g values for DynamicGate")
    ap.add_argument("--densities", default="0.5,0.3,0.155,0.08",
                    help="comma-separated weight densities for magnitude pruning")
    ap.add_argument("--runs", default=None, help="run directories (default runs/curve_<dataset>)")
    ap.add_argument("--out", default=None, help="output prefix (default results/dgmlp/<dataset>_curve)")
    ap.add_argument("--plot-only", action="store_true", help="do not train; plot finished runs")
    args = ap.parse_args(argv)
    try:
        lambdas = [float(v) for v in args.lambdas.split(",")]
        densities = [float(v) for v in args.densities.split(",")]
    except ValueError as e:
        raise SystemExit(f"--lambdas/--densities must be comma-separated numbers ({e})")
    runs_dir = Path(args.runs or f"runs/curve_{args.dataset}")
    out = Path(args.out or f"results/dgmlp/{args.dataset}_curve")
    runs = planned_runs(lambdas, densities)
    if not args.plot_only:
        runs_dir.mkdir(parents=True, exist_ok=True)
        train_missing(args.dataset, runs_dir, runs)
    missing = [n for n, _, _ in runs if not (runs_dir / n / "eval.json").exists()]
    if missing:
        raise SystemExit(f"no eval.json for {missing} under {runs_dir}; run without --plot-only")
    points = collect(runs_dir, runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    md = table(points, args.dataset)
    write_json_atomic(out.with_suffix(".json"),
                      dict(**stamp(), dataset=args.dataset, points=points), sort_keys=False)
    write_text_atomic(out.with_suffix(".md"), md)
    save(plot(points, args.dataset), out.with_suffix(".png"), dpi=150)
    print(md)
    print(f"wrote {out}.png, .json, .md")


if __name__ == "__main__":
    main()
