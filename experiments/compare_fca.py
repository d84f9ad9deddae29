"""Side-by-side Frozen-Controller Audit table of two audit.py runs (FeatureGate vs MUDD).

    python experiments/compare_fca.py runs/fca/compare/audit_feature_gate/results.json \
        runs/fca/compare/audit_mudd/results.json

One row per condition (the static and structure-removed references carry each family's own
label, e.g. LayerMean / StaticMixMean), then the factorial effects: the ΔNLL estimate
(nats/token, mean over checkpoints, with its CI) of each audit and the ratio MUDD / FeatureGate
(where FeatureGate's CI includes 0, also MUDD over the largest |ΔNLL| that CI allows).
The paper's finding to check: MUDD's reassignment penalties (cross_input, token_shuffle) are
orders of magnitude above FeatureGate's.
"""
from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import json
import sys


def _cell(row):
    if row is None:
        return "—"
    return f"{row['estimate']:+.5f} [{row['ci_low']:+.5f}, {row['ci_high']:+.5f}]"


def _ratio(a, b):
    """MUDD / FeatureGate; where FeatureGate's CI includes 0 that ratio is noise, so the
    parenthesis adds the conservative one: MUDD over the largest |ΔNLL| FeatureGate's CI allows."""
    if a is None or b is None:
        return "—"
    bound = max(abs(a["ci_low"]), abs(a["ci_high"]))
    plain = f"{b['estimate'] / a['estimate']:.3g}" if a["estimate"] else "—"
    if a["ci_low"] <= 0 <= a["ci_high"] and bound > 0:
        return f"{plain} (vs CI bound {b['estimate'] / bound:.3g})"
    return plain


def _units(res):
    checkpoints = res.get("meta", {}).get("checkpoints", [])
    return ", ".join(c.get("name", "?") for c in checkpoints) or "?"


def table(fg: dict, mudd: dict, names=("FeatureGate", "MUDD")) -> str:
    lines = [f"| condition | ΔNLL {names[0]} | ΔNLL {names[1]} | ratio {names[1]}/{names[0]} |",
             "|---|---|---|---|"]
    sections = ("conditions", "effects")
    for section in sections:
        keys = list(fg.get(section, {}))
        keys += [k for k in mudd.get(section, {}) if k not in keys]
        for key in keys:
            a, b = fg[section].get(key), mudd[section].get(key)
            labels = [r.get("label", key) for r in (a, b) if r is not None]
            label = " / ".join(dict.fromkeys(labels))   # e.g. LayerMean / StaticMixMean
            lines.append(f"| {label} | {_cell(a)} | {_cell(b)} | {_ratio(a, b)} |")
    for name, res in zip(names, (fg, mudd)):
        rp = res.get("replay", {})
        lines.append(f"\n{name}: {_units(res)}; unit of inference: {res.get('unit', '?')}; "
                     f"exact replay: {rp.get('exact')}; NLL (Correct): {rp.get('nll', float('nan')):.4f}")
    return "\n".join(lines)


def main(argv):
    if len(argv) != 3:
        raise SystemExit(__doc__)
    with open(argv[1]) as f:
        fg = json.load(f)
    with open(argv[2]) as f:
        mudd = json.load(f)
    print(table(fg, mudd))


if __name__ == "__main__":
    main(sys.argv)
