"""A model's first ``init`` in a fresh process: one compiled program (``Model.init`` now)
against the Linen module initialised op by op (what ``init`` did before) and against the
compiled program with JAX's own CPU lowering of the threefry hash (a rolled loop; dynjax.models
unrolls it, dynjax.runtime.unroll_threefry_on_cpu), per family at the shipped tiny configs'
sizes (and one unscanned), in one run; then 4096 x 4096 normals drawn under each lowering.

    python benchmarks/init_time.py [--out results/init_time.json]

Each form runs in its own subprocess with no compilation cache, so none reuses another's
compiled operations: the time (and CPU time: XLA compiles on several threads) a user waits at
the first ``model.init`` of a session. The forms' parameters are bit for bit equal
(tests/unit/models/test_registry.py, tests/unit/test_runtime.py); JSON out.
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
           "mudd": "mudd_tiny:mudd",      # configs/MODULE.py:ARG[:scan_layers=False]
           "feature_gate_unscanned": "tiny:feature_gate:unscanned"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import importlib, json, resource, sys, time
import jax, flax.linen as nn, numpy as np
from dynjax import runtime
from dynjax.models import build
module, arg, *unscanned = sys.argv[1].split(":")
c = importlib.import_module(f"dynjax.configs.{module}").get_config(arg)
c.model.scan_layers = not unscanned
model = build(c.model.to_dict())
tokens = np.zeros((1, c.data.seq_len), np.int32)
# compiled_rolled: JAX's own CPU lowering, as before dynjax.models' change (a call, not an
# assert: python -O would drop it and time the unrolled form under the rolled name)
if sys.argv[2] == "compiled_rolled" and not runtime.unroll_threefry_on_cpu(unroll=False):
    sys.exit("JAX's threefry lowering table has moved: no rolled form to compare")
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
t0, c0 = time.perf_counter(), cpu()
if sys.argv[2].startswith("compiled"):
    params = model.init(jax.random.key(0), tokens)
else:
    params = nn.meta.unbox(model.module.init(jax.random.key(0), tokens)["params"])
jax.block_until_ready(params)
print(json.dumps({"seconds": time.perf_counter() - t0, "cpu_seconds": cpu() - c0,
                  "params": sum(int(np.size(a)) for a in jax.tree.leaves(params))}))
"""

DRAW = r"""
import json, sys, time
import jax
from dynjax import runtime
out = {}
for name in ("unrolled", "rolled"):
    if not runtime.unroll_threefry_on_cpu(unroll=name == "unrolled"):
        sys.exit("JAX's threefry lowering table has moved: no rolled form to compare")
    draw = jax.jit(lambda k: jax.random.normal(k, (4096, 4096)))
    draw(jax.random.key(0)).block_until_ready()
    times = []
    for i in range(5):
        t0 = time.perf_counter()
        draw(jax.random.key(i + 1)).block_until_ready()
        times.append(time.perf_counter() - t0)
    out[name] = min(times)
print(json.dumps(out))
"""


def child(script, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    out = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    args = ap.parse_args()
    rows = {}
    for name, config in CONFIGS.items():
        runs = {form: child(CHILD, config, form)
                for form in ("compiled", "op_by_op", "compiled_rolled")}
        module, arg, *unscanned = config.split(":")
        compiled = runs["compiled"]
        rows[name] = {"config": f"configs/{module}.py:{arg}", "scan_layers": not unscanned,
                      "params": compiled["params"],
                      **{f"{form}_s": r["seconds"] for form, r in runs.items()},
                      **{f"{form}_cpu_s": r["cpu_seconds"] for form, r in runs.items()},
                      "speedup": runs["op_by_op"]["seconds"] / compiled["seconds"],
                      "cpu_vs_rolled": compiled["cpu_seconds"] / runs["compiled_rolled"][
                          "cpu_seconds"]}
    draw = child(DRAW)
    publish_json({"command": command_line(), "runtime": describe(), "families": rows,
                  "normals_4096x4096_s": draw,
                  "draw_speedup": draw["rolled"] / draw["unrolled"]}, args.out, indent=1)


if __name__ == "__main__":
    main()
