"""Test bits-per-byte per variant across seeds (the paper's Table 1 analogue), as markdown.

    python experiments/bpb_table.py runs/fca      # reads runs/fca/VARIANT_sSEED/eval.json
"""
from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import json
import pathlib
import re
import sys

import numpy as np


def main(root):
    rows = {}
    for ev in sorted(pathlib.Path(root).glob("*_s*/eval.json")):
        m = re.fullmatch(r"(.+)_s(\d+)", ev.parent.name)
        if m:
            rows.setdefault(m.group(1), {})[int(m.group(2))] = json.loads(ev.read_text())
    seeds = sorted({s for r in rows.values() for s in r})
    print("| variant | " + " | ".join(f"seed {s}" for s in seeds) +
          " | mean test bits/byte | test gate mass |")
    print("|---|" + "---|" * (len(seeds) + 2))
    for variant, by_seed in rows.items():
        bpb = [by_seed[s]["test"]["bpb"] if s in by_seed else np.nan for s in seeds]
        mass = [by_seed[s]["test"].get("gate_mass", np.nan) for s in by_seed]
        cells = " | ".join(f"{b:.4f}" for b in bpb)
        mass_cell = "—" if np.all(np.isnan(mass)) else f"{np.nanmean(mass):.4f}"
        print(f"| {variant} | {cells} | {np.nanmean(bpb):.4f} ± {np.nanstd(bpb):.4f} | {mass_cell} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/fca")
