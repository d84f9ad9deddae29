"""A model's first ``init`` in a fresh process: one compiled program (``Model.init`` now)
against the Linen module initialised op by op (what ``init`` did before), per family at the
shipped tiny configs' sizes, in one run.

    python benchmarks/init_time.py [--out results/init_time.json]

Each form runs in its own subprocess with no compilation cache, so neither reuses the
other's compiled operations: the time a user waits at the first ``model.init`` of a session.
The two forms' parameters are bit for bit equal (tests/unit/models/test_registry.py); JSON out.
"""
from dynjax.runtime import describe, setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse
import json
import os
import subprocess
import sys

from dynjax.jsonio import command_line, publish_json  # noqa: E402

CONFIGS = {"feature_gate": "tiny:feature_gate", "mod": "mod_tiny:mod", "moe": "moe_tiny:moe",
           "mudd": "mudd_tiny:mudd"}      # configs/MODULE.py:ARG
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import importlib, json, sys, time
import jax, flax.linen as nn, numpy as np
from dynjax.models import build
module, arg = sys.argv[1].split(":")
c = importlib.import_module(f"dynjax.configs.{module}").get_config(arg)
model = build(c.model.to_dict())
tokens = np.zeros((1, c.data.seq_len), np.int32)
t0 = time.perf_counter()
if sys.argv[2] == "compiled":
    params = model.init(jax.random.key(0), tokens)
else:
    params = nn.meta.unbox(model.module.init(jax.random.key(0), tokens)["params"])
jax.block_until_ready(params)
print(json.dumps({"seconds": time.perf_counter() - t0,
                  "params": sum(int(np.size(a)) for a in jax.tree.leaves(params))}))
"""


def first_init(config, form):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    out = subprocess.run([sys.executable, "-c", CHILD, config, form], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = {}
    for name, config in CONFIGS.items():
        compiled, op_by_op = first_init(config, "compiled"), first_init(config, "op_by_op")
        rows[name] = {"config": f"configs/{config.replace(':', '.py:')}",
                      "params": compiled["params"], "compiled_s": compiled["seconds"], "op_by_op_s": op_by_op["seconds"],
                      "speedup": op_by_op["seconds"] / compiled["seconds"]}
    publish_json({"command": command_line(), "runtime": describe(), "families": rows},
                 args.out, indent=1)


if __name__ == "__main__":
    main()
