"""Regenerate results/plan/: the memory plan of the 76M and 504M presets on a few meshes,
one JSON per row (naming its command), and print the README's table.

    .venv/bin/python experiments/plan_table.py
"""
from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "results" / "plan"
GiB = 1024 ** 3
ROWS = [  # (name, config, mesh, preset)
    ("76m_dp8", "configs/featuregate_76m.py:feature_gate", "data=8", "dp"),
    ("76m_fsdp8", "configs/featuregate_76m.py:feature_gate", "fsdp=8", "fsdp"),
    ("76m_dp8_fsdp4", "configs/featuregate_76m.py:feature_gate", "data=8,fsdp=4", "fsdp"),
    ("504m_dp8", "configs/featuregate_504m.py:feature_gate", "data=8", "dp"),
    ("504m_fsdp8", "configs/featuregate_504m.py:feature_gate", "fsdp=8", "fsdp"),
    ("504m_fsdp8_tp4", "configs/featuregate_504m.py:feature_gate", "fsdp=8,tensor=4", "fsdp_tp"),
    ("504m_dp16_fsdp8", "configs/featuregate_504m.py:feature_gate", "data=16,fsdp=8", "fsdp"),
]


def run(name, config, mesh, preset):
    out = OUT / f"{name}.json"
    subprocess.run([sys.executable, "-m", "dynjax.programs.plan", f"--config={config}", f"--mesh={mesh}",
                    f"--preset={preset}", f"--out={out.relative_to(ROOT)}"],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def table(plans) -> str:
    g = lambda n: f"{n / GiB:.2f}"
    chips = sorted(plans[0]["device_memory"], key=plans[0]["device_memory"].get)

    def fit(p, key):
        ok = [c for c in chips if p[key][c]]
        return "all" if len(ok) == len(chips) else ", ".join(ok) or "none"

    lines = ["| model | mesh | preset | batch/device | params | optimizer | gradients | "
             "activations no remat / remat | total no remat / remat | fits without remat | "
             "fits with remat |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in plans:
        mesh = ", ".join(f"{a} {n}" for a, n in p["mesh"].items() if n > 1)
        lines.append(f"| {p['params_count'] / 1e6:.0f}M | {mesh} | {p['preset']} | "
                     f"{p['batch_per_device']} | {g(p['params'])} | {g(p['optimizer'])} | "
                     f"{g(p['gradients'])} | {g(p['activations_no_remat'])} / "
                     f"{g(p['activations_remat'])} | {g(p['total_no_remat'])} / "
                     f"{g(p['total_remat'])} | {fit(p, 'fits_no_remat')} | "
                     f"{fit(p, 'fits_remat')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    print(table([run(*row) for row in ROWS]))
