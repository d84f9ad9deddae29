"""What MUDD's cross-layer mix costs a training step, and the XLA:CPU option that halves it.

    python -m benchmarks.mudd_mix --out=results/mudd_mix.json

- ``train_step``: train.py's jitted step (``lm.Training.train_step``) of FeatureGate and MUDD at
  the sweep's larger size (``experiments/fca_sweep.py``'s ``large`` rows: 8 layers, d = 256,
  8 heads, d_ff = 1024, batch 32 x 128), and MUDD's step compiled with XLA's default
  options instead of its family's (``families.no_ynn_reduce_on_cpu``: no YNNPACK reduce
  fusions); time ratios, and the ratios of XLA's FLOP and bytes-accessed counts.
- ``mix``: forward + backward (gradients for the coefficients and every source) of the mix
  ``stream_c = sum_s A[c, ..., s] * X_s`` alone at that shape (C = 4 streams, d = 256), for
  S = 2, 5 and 9 sources: ``dynjax`` is ``dynjax.models.muddpythia.mix`` (S multiply-adds,
  float32), ``einsum`` the same sum as one contraction over the stacked sources. Same values
  up to float rounding (``max_abs_diff``). Both under XLA's default options.

Timings: median of ``--repeats`` calls after warm-up, all sides taking turns
(``latency.paired_medians``), so each ratio is measured in one run on one machine; under
dynjax's allocator setting, as train.py runs.
"""
from __future__ import annotations

import argparse
import platform

from dynjax import runtime
from dynjax.runtime import describe

runtime.setup(__name__)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from dynjax.configs import mudd_tiny, tiny  # noqa: E402
from dynjax.jsonio import command_line, publish_json  # noqa: E402
from dynjax.measure.latency import paired_medians  # noqa: E402
from dynjax.models.muddpythia import mix  # noqa: E402
from dynjax.train.lm import Training  # noqa: E402

C, B, T, D = 4, 32, 128, 256
LARGE = dict(n_layers=8, d_model=256, n_heads=8, d_ff=1024)


def einsum_mix(coef, sources, dtype):
    """The mix as one contraction over the stacked sources, at full float32 precision."""
    stacked = jnp.stack([x.astype(jnp.float32) for x in sources])      # (S, B, T, D)
    return jnp.einsum("cbts,sbtd->cbtd", coef, stacked,
                      precision=jax.lax.Precision.HIGHEST).astype(dtype)


def mix_gradients(mix_fn):
    """Jitted (coef, sources, cotangent) -> d(coef), d(sources) of <mix, cotangent>."""
    loss = lambda coef, sources, g: jnp.vdot(mix_fn(coef, sources, jnp.float32), g)
    return jax.jit(jax.grad(loss, argnums=(0, 1)))


def measure_mix(n_sources: int, repeats: int) -> dict:
    keys = jax.random.split(jax.random.key(n_sources), n_sources + 2)
    coef = jax.random.normal(keys[0], (C, B, T, n_sources))
    sources = [jax.random.normal(k, (B, T, D)) for k in keys[1:-1]]
    g = jax.random.normal(keys[-1], (C, B, T, D))
    grads = {"dynjax": mix_gradients(mix), "einsum": mix_gradients(einsum_mix)}
    t = paired_medians({k: (lambda f=f: f(coef, sources, g)) for k, f in grads.items()},
                       repeats)
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
        jax.tree_util.tree_leaves(grads["dynjax"](coef, sources, g)),
        jax.tree_util.tree_leaves(grads["einsum"](coef, sources, g))))
    return {"sources": n_sources, "dynjax_s": t["dynjax"], "einsum_s": t["einsum"],
            "dynjax_over_einsum": t["dynjax"] / t["einsum"], "max_abs_diff": diff}


def trainer_step(config, tokens, family_options: bool = True):
    """train.py's jitted step (``lm.Training.train_step``) and its first state; without
    ``family_options``, compiled with XLA's default options instead of the family's."""
    task = Training(config)
    if not family_options:
        task.hooks = task.hooks._replace(compiler_options=lambda backend: None)
    return task.train_step(), task.init_state(jax.random.key(0))


def measure_train_step(repeats: int) -> dict:
    tokens = jax.random.randint(jax.random.key(0), (B, T), 0, 256)
    timers, counts = {}, {}
    for name, module, variant, own in (("feature_gate", tiny, "feature_gate", True),
                                       ("mudd", mudd_tiny, "mudd", True),
                                       ("mudd_default_xla", mudd_tiny, "mudd", False)):
        config = module.get_config(variant)
        config.train.batch_size, config.data.seq_len = B, T
        config.model.update(LARGE)
        step, state = trainer_step(config, tokens, own)
        compiled = step.lower(state, tokens).compile()   # counted and timed: one compile
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        counts[name] = {k: float(cost[k]) for k in ("flops", "bytes accessed")}
        timers[name] = _stepper(compiled, state, tokens)
    t = paired_medians(timers, repeats)
    ratio = lambda k: counts["mudd"][k] / counts["feature_gate"][k]
    return {**{f"{k}_s": v for k, v in t.items()},
            "mudd_over_feature_gate": t["mudd"] / t["feature_gate"],
            "mudd_default_xla_over_feature_gate": t["mudd_default_xla"] / t["feature_gate"],
            "xla_counts": counts, "flops_ratio": ratio("flops"),
            "bytes_accessed_ratio": ratio("bytes accessed")}


def _stepper(step, state, tokens):
    box = {"state": state}

    def run():
        box["state"], metrics = step(box["state"], tokens)
        return metrics["loss"]
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--sources", default="2,5,9", help="source counts S for the mix alone")
    ap.add_argument("--out", default=None, help="also write the JSON here (atomically)")
    args = ap.parse_args()
    result = {"command": command_line(), "runtime": describe(), "host": platform.node(),
              "backend": jax.default_backend(), "shape": {"C": C, "B": B, "T": T, "D": D},
              "mix": [measure_mix(int(s), args.repeats) for s in args.sources.split(",")],
              "train_step": {"size": LARGE, **measure_train_step(args.repeats)}}
    publish_json(result, args.out)


if __name__ == "__main__":
    main()
