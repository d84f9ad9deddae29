"""What real checkpoints need in memory under dynjax.loaders.hf: parameters, total and
active per token, and their bytes at bfloat16 and float32 (docs/hf.md's table).

    python experiments/hf_memory_table.py [--out=results/hf_memory.json]

The configs are the architecture fields of the published config.json files (copied by hand;
nothing is downloaded), turned into ``llm.Config`` by the loader's own ``config_from_hf``,
so a field the port would refuse fails here too. Counts come from ``llm.param_table``.
"""
from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dynjax._alloc import reexec  # noqa: E402  one runtime set-up for every program (dynjax/_alloc.py)
reexec(__name__)
import argparse  # noqa: E402

from dynjax.loaders.hf_architectures import CONFIGS  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "results/hf_memory.json"))
    args = ap.parse_args()
    from dynjax import jsonio
    from dynjax.loaders import hf
    from dynjax.models import llm

    rows = {}
    for name, fields in CONFIGS.items():
        cfg = hf.config_from_hf(fields)
        n = llm.param_count(cfg)
        rows[name] = {"model_type": cfg.model_type, "params": n["total"],
                      "active_params": n["active"], "bf16_GiB": n["total"] * 2 / 2 ** 30,
                      "f32_GiB": n["total"] * 4 / 2 ** 30}
        print(f"{name:32s} {n['total'] / 1e9:6.2f}B params, {n['active'] / 1e9:5.2f}B active,"
              f" {rows[name]['bf16_GiB']:6.1f} GiB bf16, {rows[name]['f32_GiB']:6.1f} GiB f32")
    jsonio.write_json_atomic(args.out, {"command": jsonio.command_line(), "models": rows})


if __name__ == "__main__":
    main()
