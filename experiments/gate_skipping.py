"""Post-training skipping of residual-gate updates: the audit paper's thresholding study.

    .venv/bin/python experiments/gate_skipping.py RUN_DIR [RUN_DIR ...] [--windows 128]
        [--out results/skipping]

For each gate checkpoint (feature_gate, layer_static, uniform): zero every update whose gate
is below tau over a sweep of tau (quantiles of the recorded gates), and, on the same
checkpoint, keep only the first K blocks (K = L .. 0); test bits/byte against the fraction
of (layer, token) updates removed (``dynjax.measure.update_removal``). Writes
OUT/skipping.json (with the command) and OUT/skipping.png, atomically.
"""
from __future__ import annotations

from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse
from pathlib import Path

from dynjax.data import text  # noqa: E402
from dynjax.figures import save, styled  # noqa: E402
from dynjax.measure import update_removal  # noqa: E402
from dynjax.runs import rundir  # noqa: E402
from dynjax.jsonio import portable_path, stamp, write_json_atomic  # noqa: E402


def curves_of(run_dir: str, n_windows: int) -> dict:
    config, model, params = rundir.load_params(run_dir)
    dc = config.data
    splits = text.load_splits(dc.source, dc.get("path"), dc.get("tfds_name"), dc.get("data_dir"))
    windows = text.eval_windows(splits["test"], dc.seq_len, n_windows)
    taus = update_removal.gate_quantile_taus(model, params, windows)
    out = update_removal.skipping_curves(model, params, windows, taus)
    return {"run": portable_path(run_dir), "model": f"{model.cfg.family}/{model.cfg.variant}", **out}


@styled
def plot(results: list, windows: int | None = None):
    """Test bits/byte against the fraction of updates removed, per checkpoint: thresholding
    the gate (solid, circles) and truncating depth (dashed, squares), on a linear axis."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(6.8, 4.4), layout="constrained")
    ax = fig.subplots()
    for i, r in enumerate(results):
        color = f"C{i}"
        th = r["threshold"]
        ax.plot([p["removed"] for p in th], [p["bpb"] for p in th], "o-", color=color,
                label=f"{r['model']}: updates with gate < τ removed")
        tr = r["truncate"]
        ax.plot([p["removed"] for p in tr], [p["bpb"] for p in tr], "s--", color=color,
                mfc="white", label=f"{r['model']}: only the first K blocks kept")
    ax.set_xlabel("fraction of (layer, token) updates removed")
    ax.set_ylabel("test bits/byte")
    ax.set_xlim(-0.03, 1.03)
    ax.set_title("Removing residual updates after training"
                 + (f" ({windows} test windows)" if windows else ""))
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--windows", type=int, default=128)
    ap.add_argument("--out", default="results/skipping")
    args = ap.parse_args()
    results = [curves_of(r, args.windows) for r in args.runs]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "skipping.json", {
        **stamp(),
        "windows": args.windows, "checkpoints": results,
        "note": "removing an update saves nothing here: a FeatureGate's gate is known only "
                "after its block ran (its features read the block's attention)"})
    save(plot(results, args.windows), out / "skipping.png")
    for r in results:
        print(f"{r['run']} ({r['model']}): plain {r['plain_bpb']:.4f} bits/byte")
        print("  gate < tau removed: " + ", ".join(
            f"{p['removed']:.3f} -> {p['bpb']:.4f}" for p in r["threshold"]))
        print("  first K blocks kept: " + ", ".join(
            f"{p['removed']:.3f} -> {p['bpb']:.4f}" for p in r["truncate"][::-1]))


if __name__ == "__main__":
    main()
