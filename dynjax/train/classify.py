"""Classification training for the MLP family (DynamicGate-MLP and its baselines).

Read top to bottom: ``resolve_config`` -> ``gate_schedule`` -> ``make_tx`` ->
``make_train_step`` -> ``evaluate`` -> ``train``. It reuses the LM loop's pieces
(``make_optimizer``: AdamW + warm-up-cosine + clipping; the orbax checkpoint manager; the
JSONL writer) and adds what classification needs: the gate training recipe, weight
sparsity (RigL / magnitude pruning) and compute accounting (:mod:`dynjax.measure.macs`).

The DynamicGate recipe (``config.gate``), all functions of the step so one compiled step
serves the whole run:

- ``warmup_steps``: gates forced open (the GateNet still learns through the task loss) and
  no usage penalty, so the backbone first learns as a dense net.
- after warm-up, over ``anneal_steps``: tau goes geometrically from ``tau_start`` to
  ``model.tau``, theta linearly from ``theta_start`` to ``model.theta``.
- ``lambda_g`` ramps linearly from 0 over ``ramp_steps`` after warm-up.
- ``model.min_keep``: the anti-collapse guard (see :mod:`dynjax.models.gated_mlp`).

Objective: ``J = cross-entropy + lambda_g(t) * sum_l mean(p_l) + sown aux losses``.

Data parallel over every device of every process (``config.sharding.mesh``, default all
on "data"; the state replicated): each process builds only its rows of a step's batch and
of each evaluation batch, and process 0 alone writes the run directory's files.
"""
from __future__ import annotations

import functools
import pathlib
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from tqdm.auto import tqdm

from dynjax import errors
from dynjax.data import tabular, tfds_classify
from dynjax.measure import macs as macs_lib
from dynjax.models.gated_mlp import GatedMLP, MLPConfig, gate_penalty
from dynjax.train import checkpoint, distributed, sharding, sparse
from dynjax.train.loop import check_train_config, make_optimizer
from dynjax.train.metrics import JsonlWriter, write_json_atomic

SPARSE_METHODS = ("none", "rigl", "prune")


def resolve_config(config) -> ml_collections.ConfigDict:
    """Validate everything with a clear message; returns a plain copy."""
    config = ml_collections.ConfigDict(config.to_dict())
    dataset = config.data.dataset
    if dataset.startswith(tfds_classify.PREFIX):
        if not config.data.get("data_dir"):
            raise ValueError(f"data.dataset={dataset!r} needs data.data_dir, the directory "
                             "where the TFDS dataset was built")
    elif dataset not in tabular.DATASETS:
        raise ValueError(f"unknown data.dataset={dataset!r}; choose one of "
                         f"{sorted(tabular.DATASETS)} or 'tfds:NAME' (e.g. tfds:cifar10)")
    g = config.gate
    if not g.tau_start > 0:
        raise ValueError(f"gate.tau_start={g.tau_start} must be > 0")
    if not 0 < g.theta_start < 1:
        raise ValueError(f"gate.theta_start={g.theta_start} must lie in (0, 1)")
    if g.lambda_g < 0 or min(g.warmup_steps, g.anneal_steps, g.ramp_steps) < 0:
        raise ValueError("gate.lambda_g and the gate schedule lengths must be >= 0")
    MLPConfig.from_dict(model_dict(config, 1, 2))  # validates theta, tau, widths, variant
    if config.sparse.method not in SPARSE_METHODS:
        raise ValueError(f"unknown sparse.method={config.sparse.method!r}; choose one of "
                         f"{SPARSE_METHODS}")
    check_train_config(config.train)
    return config


def tfds_keys(data_config) -> tuple:
    """The run's TFDS input and label feature names (used only for ``tfds:`` datasets)."""
    return data_config.get("tfds_input_key"), data_config.get("tfds_label_key", "label")


def load_data(data_config) -> dict:
    """The run's ``{split: (x, y)}`` (tabular/image data, or a prepared TFDS dataset)."""
    return tabular.load(data_config.dataset, data_config.get("data_dir"),
                        *tfds_keys(data_config))


def model_dict(config, in_dim, n_classes):
    """The GatedMLP config of a run: its model fields plus the data's input and class sizes."""
    d = dict(config.model.to_dict())
    d["hidden"] = tuple(d["hidden"])
    return {**d, "in_dim": in_dim, "n_classes": n_classes}


def gate_schedule(config, step):
    """(tau, theta, gates_open, lambda_g) at ``step`` (a traced int is fine)."""
    g, m = config.gate, config.model
    step = jnp.asarray(step, jnp.float32)
    t = jnp.clip((step - g.warmup_steps) / max(g.anneal_steps, 1), 0.0, 1.0)
    tau = g.tau_start * (m.tau / g.tau_start) ** t
    theta = g.theta_start + (m.theta - g.theta_start) * t
    ramp = jnp.clip((step - g.warmup_steps) / max(g.ramp_steps, 1), 0.0, 1.0)
    return {"tau": tau, "theta": theta, "gates_open": step < g.warmup_steps,
            "lambda_g": g.lambda_g * ramp}


def make_tx(config) -> optax.GradientTransformation:
    tx = make_optimizer(config.train)
    s = config.sparse
    if s.method == "rigl":
        return sparse.rigl(tx, s.sparsity, s.update_every, s.drop_fraction,
                           int(s.end_fraction * config.train.steps), config.seed)
    if s.method == "prune":
        return sparse.magnitude_prune(tx, s.density, int(s.prune_fraction * config.train.steps))
    return tx


def init_state(model, tx, key):
    params = model.init(key, jnp.zeros((1, model.cfg.in_dim), jnp.float32))
    return {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}


def make_train_step(config, model, tx, mesh=None):
    def loss_fn(params, x, y, sched, rng):
        logits, coeffs, aux = model.apply(params, x, tau=sched["tau"], theta=sched["theta"],
                                          gates_open=sched["gates_open"], train=True, rng=rng,
                                          with_aux=True)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        usage = gate_penalty(coeffs)
        loss = ce + sched["lambda_g"] * usage + sum(aux["losses"].values(), 0.0)
        acc = jnp.mean(jnp.argmax(logits, -1) == y)
        opens = jnp.stack([o.mean() for o in aux["open"]])
        return loss, {"ce": ce, "usage": usage, "acc": acc, "open_rate_per_layer": opens}

    def train_step(state, x, y):
        sched = gate_schedule(config, state["step"])
        rng = jax.random.fold_in(jax.random.key(config.seed), state["step"])
        grads, metrics = jax.grad(loss_fn, has_aux=True)(state["params"], x, y, sched, rng)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        new = {"step": state["step"] + 1, "params": optax.apply_updates(state["params"], updates),
               "opt_state": opt_state}
        metrics.update(grad_norm=optax.tree.norm(grads), tau=sched["tau"],
                       theta=sched["theta"], lambda_g=sched["lambda_g"])
        return new, metrics

    if mesh is None:
        return jax.jit(train_step, donate_argnums=0)
    rep, rows = sharding.replicated(mesh), sharding.batch_sharding(mesh)
    return jax.jit(train_step, in_shardings=(rep, rows, rows), out_shardings=(rep, rep),
                   donate_argnums=0)


def make_eval_step(model, mesh=None):
    def eval_step(params, x, y, valid, sched, weight_masks):
        logits, _, aux = model.apply(params, x, tau=sched["tau"], theta=sched["theta"],
                                     gates_open=sched["gates_open"], with_aux=True)
        v = valid.astype(jnp.float32)
        nll = optax.softmax_cross_entropy_with_integer_labels(logits, y)
        sums = macs_lib.model_mac_sums(model, aux["open"], weight_masks, v)
        return {"correct": jnp.sum((jnp.argmax(logits, -1) == y) * v), "nll": jnp.sum(nll * v),
                **sums}
    if mesh is None:
        return jax.jit(eval_step)
    return jax.jit(eval_step, out_shardings=sharding.replicated(mesh))


def evaluate(eval_step, model, params, opt_state, x, y, batch_size, sched, put=None):
    """Accuracy, NLL, open rates and RelMAC over (x, y); the last batch is padded to the
    compiled shape and its padding masked out of every sum. ``put`` places a host batch on
    the devices (split over a mesh's data axes)."""
    names = [f"layer_{l}" for l in range(len(model.cfg.hidden))] + ["out"]
    wm = sparse.weight_masks(opt_state, params, names)
    tot = None
    for lo in range(0, len(x), batch_size):
        xb, yb = x[lo:lo + batch_size], y[lo:lo + batch_size]
        pad = batch_size - len(xb)
        valid = np.arange(batch_size) < len(xb)
        if pad:
            xb = np.concatenate([xb, np.zeros((pad, xb.shape[1]), xb.dtype)])
            yb = np.concatenate([yb, np.zeros(pad, yb.dtype)])
        batch = (xb, yb, valid) if put is None else put((xb, yb, valid))
        out = jax.device_get(eval_step(params, *batch, sched, wm))
        tot = out if tot is None else jax.tree.map(np.add, tot, out)
    n = len(x)
    result = {"accuracy": float(tot["correct"] / n), "nll": float(tot["nll"] / n), "examples": n}
    result.update(macs_lib.report(model.dims, tot, n))
    if wm is not None:
        nnz = sum(float(np.sum(m)) for m in wm)
        result["weight_density"] = nnz / sum(np.size(m) for m in wm)
    return result


def train(config, workdir: str, progress: bool = True) -> dict:
    """Train (or resume) in ``workdir``; returns the final validation and test evaluation."""
    with errors.config_errors():   # every check before the run directory is written
        config = resolve_config(config)
        mesh = sharding.make_mesh(config.get("sharding"))
        sharding.check_batch(config.train.batch_size, mesh)
    run_dir = pathlib.Path(workdir)
    checkpoint.check_same_run(run_dir, config)
    splits = load_data(config.data)
    main = distributed.is_main()
    progress = progress and main
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run_dir / "config.json", config.to_dict())
    (x_tr, y_tr) = splits["train"]
    model = GatedMLP(model_dict(config, x_tr.shape[1], tabular.num_classes(splits)))
    tc = config.train
    tx = make_tx(config)

    mngr = checkpoint.manager(run_dir, tc.ckpt_every, tc.keep_checkpoints)
    rep, rows = sharding.replicated(mesh), sharding.batch_sharding(mesh)
    state = jax.jit(lambda k: init_state(model, tx, k), out_shardings=rep)(
        jax.random.key(config.seed))
    if mngr.latest_step() is not None:
        state = checkpoint.restore_newest(mngr, jax.tree.map(
            lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=s.sharding), state), run_dir)
        if main:
            print(f"resumed {run_dir} at step {int(state['step'])}")
    start = int(state["step"])
    step_fn = make_train_step(config, model, tx, mesh)
    eval_step = make_eval_step(model, mesh)
    # evaluation batches: the config's size rounded up to a multiple of the data-parallel
    # devices (the padding is masked out)
    n_dp = sharding.data_parallel_size(mesh)
    eval_bs = -(-config.eval.batch_size // n_dp) * n_dp
    put = functools.partial(distributed.put_global, rows)
    block_each = jax.device_count() > 1   # multi-device CPU can deadlock when pipelined
    writer = JsonlWriter(run_dir / "metrics.jsonl", resume_step=start)

    def run_eval(split, step):
        x, y = splits[split]
        sched = jax.tree.map(jnp.asarray, gate_schedule(config, step))
        return evaluate(eval_step, model, state["params"], state["opt_state"], x, y,
                        eval_bs, sched, put)

    bar = tqdm(range(start, tc.steps), initial=start, total=tc.steps, disable=not progress,
               desc=f"{config.data.dataset}/{config.model.variant}", mininterval=2)
    t_last, step_last = time.perf_counter(), start
    for step in bar:
        xb, yb = distributed.put_rows(rows, lambda r: tabular.batches(
            x_tr, y_tr, tc.batch_size, config.seed, step, r), tc.batch_size)
        state, metrics = step_fn(state, xb, yb)
        if block_each:
            jax.block_until_ready(state)
        done = step + 1
        if done % tc.log_every == 0 or done == tc.steps:
            metrics = jax.device_get(metrics)
            now = time.perf_counter()
            record = {"step": done, **{k: np.asarray(v).tolist() for k, v in metrics.items()},
                      "examples_per_s": (done - step_last) * tc.batch_size / (now - t_last)}
            writer.write(record)
            bar.set_postfix(ce=f"{record['ce']:.3f}", open=f"{np.mean(record['open_rate_per_layer']):.2f}")
            t_last, step_last = now, done
        if done % tc.eval_every == 0 and done != tc.steps:
            writer.write({"step": done, "split": "validation", **run_eval("validation", done)})
        checkpoint.save(mngr, done, state, force=done == tc.steps)
    mngr.wait_until_finished()
    bar.close()

    n_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(state["params"]))
    result = {"step": int(state["step"]), "params": n_params}
    for split in ("validation", "test"):
        result[split] = run_eval(split, int(state["step"]))
        writer.write({"step": result["step"], "split": split, **result[split]})
    if main:
        write_json_atomic(run_dir / "eval.json", result)
    return result
