"""Training: optimizer, train state, the jitted step, evaluation and the resumable loop.

Read top to bottom: ``make_optimizer`` -> ``init_state`` -> ``make_train_step`` ->
``train`` (evaluation under every routing rule lives in ``dynjax.train.evaluation``). The
train state is a plain dict {step, params, opt_state} so it goes straight into orbax and
NamedSharding. The batch for step s depends only on (seed, s),
so a run stopped and resumed from a checkpoint is bitwise identical to an uninterrupted one.
On many processes (``dynjax.train.distributed``) each builds only its rows of that batch,
so the global batch, and the run, do not depend on the number of processes; process 0
alone writes the run directory's files and the progress bar.
"""
from __future__ import annotations

import json
import pathlib
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from tqdm.auto import tqdm

from dynjax import errors
from dynjax.data import text as text_data
from dynjax.models import build
from dynjax.models.activation_sharding import traced_under
from dynjax.models.transformer import next_token_nll
from dynjax.train import checkpoint, distributed, sharding
from dynjax.train.evaluation import LN2, Evaluator
from dynjax.train.metrics import JsonlWriter, write_json_atomic



def make_optimizer(tc) -> optax.GradientTransformation:
    """AdamW with linear warm-up then cosine decay, after global-norm clipping.
    Weight decay applies to matrices only (not norms, gates or biases)."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, tc.lr, tc.warmup_steps, max(tc.steps, tc.warmup_steps + 1),
        end_value=tc.lr * tc.min_lr_ratio)
    return optax.chain(
        optax.clip_by_global_norm(tc.clip_norm),
        optax.adamw(schedule, b1=tc.b1, b2=tc.b2, weight_decay=tc.weight_decay,
                    mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)))


def init_state(config, model, key):
    tokens = jnp.zeros((1, config.data.seq_len), jnp.int32)
    params = model.init(key, tokens)
    return {"step": jnp.zeros((), jnp.int32), "params": params,
            "opt_state": make_optimizer(config.train).init(params)}


def make_train_step(model, tx):
    def loss_fn(params, tokens):
        logits, coeffs, aux = model.apply(params, tokens, with_aux=True)
        nll = next_token_nll(logits, tokens).mean()
        return nll + sum(aux.values(), 0.0), (nll, coeffs, aux)

    def train_step(state, tokens):
        (_, (loss, coeffs, aux)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state["params"], tokens)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        new_state = {"step": state["step"] + 1,
                     "params": optax.apply_updates(state["params"], updates),
                     "opt_state": opt_state}
        metrics = {"loss": loss, "grad_norm": optax.tree_utils.tree_norm(grads),
                   **{f"aux/{k}": v for k, v in aux.items()}}
        if "gate" in coeffs:
            metrics["gate_mass_per_layer"] = coeffs["gate"].mean(axis=(1, 2))
        return new_state, metrics

    return train_step


def resolve_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Fill in derived fields (the mass-matched uniform gate) and validate everything."""
    config = ml_collections.ConfigDict(config.to_dict())
    if config.get("mass_match_run"):
        if config.model.variant != "uniform":
            raise ValueError("mass_match_run is only meaningful for model.variant='uniform'")
        eval_path = pathlib.Path(config.mass_match_run) / "eval.json"
        if not eval_path.exists():
            raise ValueError(f"mass_match_run={config.mass_match_run!r} has no eval.json; "
                             "point it at a finished feature_gate run directory")
        mass = json.loads(eval_path.read_text())["validation"].get("gate_mass")
        if mass is None:
            raise ValueError(f"{eval_path} reports no gate mass; mass matching needs a gated run")
        config.model.uniform_value = float(mass)
    build(config.model.to_dict())  # validates the model config with a clear message
    check_train_config(config.train)
    if config.data.seq_len < 2:
        raise ValueError(f"data.seq_len={config.data.seq_len} must be at least 2")
    return config


def check_train_config(tc) -> None:
    """The schedule fields every training loop (LM or classifier) relies on."""
    for name in ("steps", "batch_size", "log_every", "eval_every", "ckpt_every"):
        if tc[name] <= 0:
            raise ValueError(f"train.{name}={tc[name]} must be positive")
    if not 0 < tc.lr < 1:
        raise ValueError(f"train.lr={tc.lr} is outside (0, 1)")


def train(config: ml_collections.ConfigDict, workdir: str, progress: bool = True):
    """Train (or resume) a run in ``workdir``; returns the final evaluation dict."""
    # Every check before the run directory is written: the config (a ConfigError, also for
    # what only tracing the model finds, e.g. a MoD capacity of 0 tokens), the devices, the
    # run already in the directory, the data.
    with errors.config_errors():
        config = resolve_config(config)
        dc, tc = config.data, config.train
        model = build(config.model.to_dict())
        mesh = sharding.make_mesh(config.sharding)
        rules = sharding.rules_of(config.sharding)
        sharding.check_batch(tc.batch_size, mesh)
        sharding.check_batch(config.eval.batch_size, mesh, "eval.batch_size")
        abstract = jax.eval_shape(lambda: init_state(config, model, jax.random.key(0)))
    run_dir = pathlib.Path(workdir)
    checkpoint.check_same_run(run_dir, config, keys=("model", "data", "seed"))
    splits = text_data.load_splits(dc.source, dc.get("path"), dc.get("tfds_name"),
                                   dc.get("data_dir"))
    main = distributed.is_main()
    progress = progress and main
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run_dir / "config.json", config.to_dict())
    tx = make_optimizer(tc)

    dummy = jnp.zeros((1, dc.seq_len), jnp.int32)
    p_shard = sharding.param_shardings(model.logical_axes(dummy), mesh, rules)
    rep = sharding.replicated(mesh)
    state_shardings = {
        "step": rep, "params": p_shard,
        "opt_state": optax.tree_map_params(tx, lambda _, s: s, abstract["opt_state"], p_shard,
                                           transform_non_params=lambda _: rep)}
    data_shard = sharding.batch_sharding(mesh)

    mngr = checkpoint.manager(run_dir, tc.ckpt_every, tc.keep_checkpoints)
    if mngr.latest_step() is not None:
        target = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                              abstract, state_shardings)
        state = checkpoint.restore_newest(mngr, target, run_dir)
        if main:
            print(f"resumed {run_dir} at step {int(state['step'])}")
    else:
        state = jax.jit(lambda k: init_state(config, model, k),
                        out_shardings=state_shardings)(jax.random.key(config.seed))
    start = int(state["step"])
    n_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(state["params"]))

    # activations keep the rules' layout too (dynjax.models.activation_sharding)
    step_fn = jax.jit(traced_under(make_train_step(model, tx), mesh, rules),
                      in_shardings=(state_shardings, data_shard),
                      out_shardings=(state_shardings, rep), donate_argnums=0)
    evaluator = Evaluator(model.cfg, config.eval.get("route"), mesh=mesh)
    val_windows = text_data.eval_windows(splits["validation"], dc.seq_len, config.eval.windows)
    writer = JsonlWriter(run_dir / "metrics.jsonl", resume_step=start)
    # Multi-device CPU simulation can deadlock when steps are pipelined: block each step.
    block_each = jax.device_count() > 1 or tc.get("block_every_step", False)

    bar = tqdm(range(start, tc.steps), initial=start, total=tc.steps, disable=not progress,
               desc=f"{config.model.variant} ({n_params / 1e6:.2f}M params)", mininterval=2)
    t_last, step_last = time.perf_counter(), start
    for step in bar:
        batch = distributed.put_rows(data_shard, lambda rows: text_data.train_batch(
            splits["train"], dc.seq_len, tc.batch_size, config.seed, step, rows), tc.batch_size)
        state, metrics = step_fn(state, batch)
        if block_each:
            jax.block_until_ready(state)
        done = step + 1
        if done % tc.log_every == 0 or done == tc.steps:
            metrics = jax.device_get(metrics)
            now = time.perf_counter()
            record = {"step": done, "loss": float(metrics["loss"]),
                      "bpb": float(metrics["loss"]) / LN2,
                      "grad_norm": float(metrics["grad_norm"]),
                      "tokens_per_s": (done - step_last) * tc.batch_size * dc.seq_len / (now - t_last)}
            record.update({k: float(v) for k, v in metrics.items() if k.startswith("aux/")})
            if "gate_mass_per_layer" in metrics:
                record["gate_mass_per_layer"] = metrics["gate_mass_per_layer"].tolist()
                record["gate_mass"] = float(np.mean(metrics["gate_mass_per_layer"]))
            writer.write(record)
            bar.set_postfix(bpb=f"{record['bpb']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
            t_last, step_last = now, done
        if done % tc.eval_every == 0 and done != tc.steps:
            val = evaluator(state["params"], val_windows, config.eval.batch_size)
            writer.write({"step": done, "split": "validation", **val})
            if progress:
                bar.write(f"step {done} validation {evaluator.describe(val)}")
        checkpoint.save(mngr, done, state, force=done == tc.steps)
    mngr.wait_until_finished()
    bar.close()

    result = {"step": int(state["step"]), "params": n_params}
    for split in ("validation", "test"):
        windows = text_data.eval_windows(splits[split], dc.seq_len, config.eval.windows)
        result[split] = evaluator(state["params"], windows, config.eval.batch_size)
        writer.write({"step": result["step"], "split": split, **result[split]})
        if progress:
            print(f"{split} {evaluator.describe(result[split])}")
    n_dec = config.eval.get("decode_check_windows", 0)
    if n_dec:
        result["test"]["decode_agreement"] = evaluator.decode_agreement(
            state["params"], windows[:n_dec], config.eval.batch_size)
    if main:
        write_json_atomic(run_dir / "eval.json", result)
    return result
