"""Behaviour digests: is a refactor really a refactor? Bitwise, for every model family.

    python scripts/check_digests.py           # compare with scripts/digests.json, exit 1 if any differs
    python scripts/check_digests.py --write   # store today's digests (only before a refactor)

For each family (every gates variant, MoD, staged and integrated MoDE, MoE, MUDD, the
DynamicGate-MLP classifier, MUDDPythia on the bundled tiny reference) it trains a few steps
with the real trainer (tiny sizes, fixed seed), then hashes (SHA-256 of every leaf's bytes)
the parameters of the final checkpoint, and the logits and coefficients of a jitted record
pass and a jitted replay pass on fixed inputs. A refactor that keeps behaviour keeps every
digest; the output names each one that moved and by how much.

Takes a few minutes on 2 CPU cores. Digests hold on one machine type (XLA:CPU, this jax
version); regenerate them with ``--write`` only on purpose, from the commit before a change.
"""
from __future__ import annotations

from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse
import hashlib
import json
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

DIGESTS = ROOT / "scripts" / "digests.json"
LM_RUNS = {  # name -> (config module, argument, model overrides)
    "gates_dense": ("dynjax.configs.tiny", "dense", {}),
    "gates_uniform": ("dynjax.configs.tiny", "uniform", {}),
    "gates_layer_static": ("dynjax.configs.tiny", "layer_static", {}),
    "gates_feature_gate": ("dynjax.configs.tiny", "feature_gate", {}),
    "gates_fixed_depth": ("dynjax.configs.tiny", "fixed_depth2", {}),
    "mod": ("dynjax.configs.mod_tiny", "mod", {}),
    "mode_staged": ("dynjax.configs.mode_tiny", "mode_staged", {}),
    "mode_integrated": ("dynjax.configs.mode_tiny", "mode_integrated", {}),
    "moe": ("dynjax.configs.mode_tiny", "mode_integrated", {"variant": "moe"}),
    "mod_dense": ("dynjax.configs.mod_tiny", "dense", {}),
    "mudd": ("dynjax.configs.mudd_tiny", "mudd", {}),
    "mudd_static": ("dynjax.configs.mudd_tiny", "mudd_static", {}),
}


def sha(tree) -> str:
    """SHA-256 over every leaf's dtype, shape and bytes, in tree order (paths included)."""
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(jax.device_get(tree))[0]:
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{a.dtype}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def lm_config(module: str, arg: str, overrides: dict):
    import importlib
    c = importlib.import_module(module).get_config(arg)
    c.model.update(dict(d_model=32, n_heads=2, n_layers=4, d_ff=64, **overrides))
    c.data.seq_len = 32
    c.train.update(dict(steps=4, batch_size=4, warmup_steps=1, log_every=2, eval_every=1000,
                        ckpt_every=4))
    c.eval.update(dict(windows=8, batch_size=8, decode_check_windows=0))
    return c


def mlp_config():
    from dynjax.configs import mlp_common
    c = mlp_common.base("dgate", "mnist5k")
    c.model.update(hidden=(32, 32))
    c.gate.update(warmup_steps=1, anneal_steps=3, ramp_steps=3)
    c.train.update(steps=4, batch_size=32, warmup_steps=1, ckpt_every=4, eval_every=1000,
                   log_every=2)
    c.eval.batch_size = 256
    return c


# --- the adaptor: the only part a refactor may edit (how to train and load a run) ---------
def train_run(config, workdir: str) -> None:
    from dynjax.train.loop import train
    train(config, workdir, progress=False)


def load_run(workdir: str):
    """``(apply_fn, params, inputs)`` of a run's final checkpoint: apply_fn(params, x, coeffs)."""
    from dynjax.tasks import LM
    from dynjax.audit.targets import open_target
    target = open_target(workdir)
    if target.task is LM:
        x = jnp.asarray(np.arange(2 * 32).reshape(2, 32) * 37 % 256, jnp.int32)
    else:
        x = jax.random.normal(jax.random.key(7), (4, 784), jnp.float32)
    return target.apply_fn, target.params, x


def muddpythia_digests() -> dict:
    from dynjax.loaders import muddpythia_hf
    from dynjax.models import muddpythia
    with np.load(ROOT / "tests" / "data" / "muddpythia_tiny.npz") as z:
        ref = {k: z[k] for k in z.files}
    sd = {k[len("params/"):]: v for k, v in ref.items() if k.startswith("params/")}
    cfg, params = muddpythia_hf.from_state_dict(sd)
    ids = jnp.asarray(ref["input_ids"])
    apply = jax.jit(lambda p, x, c: muddpythia.apply(cfg, p, x, c))
    return forward_digests(apply, params, ids)
# -----------------------------------------------------------------------------------------


def forward_digests(apply, params, x) -> dict:
    logits, coeffs = apply(params, x, None)
    replayed, _ = apply(params, x, coeffs)
    return {"params": sha(params), "record_logits": sha(logits), "coeffs": sha(coeffs),
            "replay_logits": sha(replayed),
            "_logits": np.asarray(logits, np.float64).ravel()[:64].tolist()}


def compute() -> dict:
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {name: (lm_config(*spec)) for name, spec in LM_RUNS.items()}
        runs["dgate_mlp"] = mlp_config()
        for name, config in runs.items():
            workdir = f"{tmp}/{name}"
            train_run(config, workdir)
            apply_fn, params, x = load_run(workdir)
            apply = jax.jit(lambda p, x_, c, f=apply_fn: f(p, x_, c))
            out[name] = forward_digests(apply, params, x)
            print(f"{name}: params {out[name]['params'][:12]}", flush=True)
    out["muddpythia"] = muddpythia_digests()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="store today's digests")
    args = ap.parse_args(argv)
    now = compute()
    if args.write:
        DIGESTS.write_text(json.dumps({"jax": jax.__version__, "digests": now}, indent=1) + "\n")
        print(f"wrote {DIGESTS}")
        return 0
    stored = json.loads(DIGESTS.read_text())["digests"]
    bad = []
    for name, want in stored.items():
        got = now.get(name, {})
        for key in ("params", "record_logits", "coeffs", "replay_logits"):
            if got.get(key) != want[key]:
                diff = (np.max(np.abs(np.subtract(got["_logits"], want["_logits"])))
                        if got else float("nan"))
                bad.append(f"{name}.{key} differs (first logits max |d| {diff:.3g})")
    print("\n".join(bad) if bad else f"all {len(stored)} families bitwise equal to "
          f"{DIGESTS.relative_to(ROOT)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
