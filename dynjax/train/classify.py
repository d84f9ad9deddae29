"""The classification task: the MLP family (DynamicGate-MLP and its baselines) on tabular
or image data.

Read top to bottom: ``resolve_config`` -> ``make_tx`` -> ``make_train_step`` -> ``evaluate``
-> :class:`Training` (what :func:`dynjax.train.loop.train` builds), with the gate recipe,
weight sparsity and compute accounting. Objective: ``J = cross-entropy + lambda_g(t) *
sum_l mean(p_l) + sown aux losses``. Data parallel, the state replicated. Details:
docs/training.md (The classification task).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from dynjax.runs import rundir
from dynjax.data import tabular, tfds_classify
from dynjax.models.gate_schedule import gate_schedule
from dynjax.measure import macs as macs_lib
from dynjax.models.gated_mlp import MLPConfig, gate_penalty
from dynjax.parallel import distributed, sharding
from dynjax.train import sparse
from dynjax.train.optim import check_train_config, make_optimizer

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
    # validates theta, tau, widths, variant
    MLPConfig.from_dict(rundir.classifier_model_dict(config, 1, 2))
    if config.sparse.method not in SPARSE_METHODS:
        raise ValueError(f"unknown sparse.method={config.sparse.method!r}; choose one of "
                         f"{SPARSE_METHODS}")
    check_train_config(config.train)
    return config


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


class Training:
    """Classification for :func:`dynjax.train.loop.train`. Built from the raw config
    (validating it); ``load_data`` reads the data and builds the model, whose input and
    class counts come from it. The state is replicated over the mesh."""

    same_run_keys = None   # any config difference refuses to resume

    def __init__(self, config):
        self.config = config = resolve_config(config)
        self.mesh = sharding.make_mesh(config.get("sharding"))
        sharding.check_batch(config.train.batch_size, self.mesh)
        self.rows = sharding.batch_sharding(self.mesh)
        self.tx = make_tx(config)

    def load_data(self):
        self.splits = rundir.load_classifier_data(self.config.data)
        self.model = rundir.model_of(self.config, self.splits)
        self.abstract = jax.eval_shape(lambda: self.init_state(jax.random.key(0)))
        rep = sharding.replicated(self.mesh)
        self.state_shardings = jax.tree.map(lambda _: rep, self.abstract)
        self.eval_step = make_eval_step(self.model, self.mesh)
        # evaluation batches: the config's size rounded up to a multiple of the
        # data-parallel devices (the padding is masked out)
        n_dp = sharding.data_parallel_size(self.mesh)
        self.eval_bs = -(-self.config.eval.batch_size // n_dp) * n_dp

    def init_state(self, key):
        return init_state(self.model, self.tx, key)

    def train_step(self, top_level: bool = True):   # no XLA options of its own
        return make_train_step(self.config, self.model, self.tx, self.mesh)

    def batch(self, step: int) -> tuple:
        x, y = self.splits["train"]
        tc = self.config.train
        return distributed.put_rows(self.rows, lambda r: tabular.batches(
            x, y, tc.batch_size, self.config.seed, step, r), tc.batch_size)

    def desc(self, n_params: int) -> str:
        return f"{self.config.data.dataset}/{self.config.model.variant}"

    def log_record(self, metrics, steps: int, seconds: float) -> dict:
        return {**{k: np.asarray(v).tolist() for k, v in metrics.items()},
                "examples_per_s": steps * self.config.train.batch_size / seconds}

    def postfix(self, record) -> dict:
        return {"ce": f"{record['ce']:.3f}",
                "open": f"{np.mean(record['open_rate_per_layer']):.2f}"}

    def evaluate(self, state, split: str, step: int) -> dict:
        x, y = self.splits[split]
        sched = jax.tree.map(jnp.asarray, gate_schedule(self.config, step))
        return evaluate(self.eval_step, self.model, state["params"], state["opt_state"], x, y,
                        self.eval_bs, sched,
                        functools.partial(distributed.put_global, self.rows))

    def describe(self, result: dict):
        return None

    def finish(self, state, result: dict) -> None:
        pass

    @staticmethod
    def summary(split: str, r: dict) -> str:
        rates = ", ".join(f"{o:.3f}" for o in r["open_rate_per_layer"])
        return (f"{split}: accuracy {r['accuracy']:.4f}, RelMAC {r['relmac']:.4f} "
                f"(MAC reduction {r['mac_reduction']:.1%}), open rate per layer [{rates}]")
