"""The language-model task: next-token training of any ``build(config.model)`` family on
byte windows, scored in bits per byte under every routing rule the model has.

Read top to bottom: ``resolve_config`` -> ``init_state`` -> ``make_train_step`` ->
:class:`Training` (what :func:`dynjax.train.loop.train` calls). The batch for step s depends
only on (seed, s), so a resumed run is bitwise the uninterrupted one; family-specific
metrics and config fields come from :mod:`dynjax.train.families`.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_collections
import optax

from dynjax.data import text as text_data
from dynjax.models import build
from dynjax.models.activation_sharding import traced_under
from dynjax.models.transformer import next_token_nll
from dynjax.parallel import distributed, sharding
from dynjax.train import families
from dynjax.train.evaluation import LN2, Evaluator
from dynjax.train.optim import check_train_config, make_optimizer


def resolve_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Fill in derived fields (the family's, e.g. the mass-matched uniform gate) and
    validate everything; returns a plain copy."""
    config = ml_collections.ConfigDict(config.to_dict())
    config = families.hooks_of(config.model.get("family")).resolve(config)
    build(config.model.to_dict())  # validates the model config with a clear message
    check_train_config(config.train)
    if config.data.seq_len < 2:
        raise ValueError(f"data.seq_len={config.data.seq_len} must be at least 2")
    return config


def init_state(config, model, key):
    tokens = jnp.zeros((1, config.data.seq_len), jnp.int32)
    params = model.init(key, tokens)
    return {"step": jnp.zeros((), jnp.int32), "params": params,
            "opt_state": make_optimizer(config.train).init(params)}


def make_train_step(model, tx):
    hooks = families.hooks_of(model.cfg.family)
    step_metrics = hooks.step_metrics

    def loss_fn(params, tokens):
        logits, coeffs, aux = model.apply(params, tokens, with_aux=True)
        nll = next_token_nll(logits, tokens).mean()
        return nll + sum(aux.values(), 0.0), (nll, coeffs, aux)

    def train_step(state, tokens):
        (_, (loss, coeffs, aux)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state["params"], tokens)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params, extra = hooks.after_update(state["params"],
                                           optax.apply_updates(state["params"], updates),
                                           coeffs, tokens, model.cfg)
        new_state = {"step": state["step"] + 1, "params": params, "opt_state": opt_state}
        metrics = {"loss": loss, "grad_norm": optax.tree_utils.tree_norm(grads),
                   **{f"aux/{k}": v for k, v in aux.items()}, **step_metrics(coeffs, model.cfg),
                   **extra}
        return new_state, metrics

    return train_step


class Training:
    """Language modelling for :func:`dynjax.train.loop.train`. Built from the raw config
    (validating it, before the run directory is touched); ``load_data`` reads the corpus."""

    same_run_keys = ("model", "data", "seed")

    def __init__(self, config):
        self.config = config = resolve_config(config)
        self.model = build(config.model.to_dict())
        self.mesh = mesh = sharding.make_mesh(config.sharding)
        self.rules = rules = sharding.rules_of(config.sharding)
        sharding.check_batch(config.train.batch_size, mesh)
        sharding.check_batch(config.eval.batch_size, mesh, "eval.batch_size")
        self.tx = tx = make_optimizer(config.train)
        self.abstract = abstract = jax.eval_shape(
            lambda: init_state(config, self.model, jax.random.key(0)))
        dummy = jnp.zeros((1, config.data.seq_len), jnp.int32)
        specs = self.model.logical_axes(dummy)
        sharding.check_divisible(abstract["params"], specs, dict(mesh.shape), rules)
        p_shard = sharding.param_shardings(specs, mesh, rules)
        rep = sharding.replicated(mesh)
        self.state_shardings = {
            "step": rep, "params": p_shard,
            "opt_state": optax.tree_map_params(tx, lambda _, s: s, abstract["opt_state"],
                                               p_shard, transform_non_params=lambda _: rep)}
        self.rows = sharding.batch_sharding(mesh)
        self.hooks = families.hooks_of(config.model.family)
        self.evaluator = Evaluator(self.model.cfg, config.eval.get("route"), mesh=mesh)

    @property
    def chance_loss(self) -> float:
        """A uniform guess's loss (nats): above it the model predicts worse than chance."""
        return math.log(self.model.cfg.vocab_size)

    def load_data(self):
        dc = self.config.data
        self.splits = text_data.load_splits(dc.source, dc.get("path"), dc.get("tfds_name"),
                                            dc.get("data_dir"))
        self._windows = {}

    def init_state(self, key):
        return init_state(self.config, self.model, key)

    def train_step(self, top_level: bool = True):
        """The jitted step; ``top_level=False`` leaves the family's XLA options to the jit
        that calls it (the loop's guard: XLA takes options from the outermost jit only)."""
        options = self.hooks.compiler_options(jax.default_backend()) if top_level else None
        # activations keep the rules' layout too (dynjax.models.activation_sharding)
        return jax.jit(traced_under(make_train_step(self.model, self.tx), self.mesh, self.rules),
                       in_shardings=(self.state_shardings, self.rows),
                       out_shardings=(self.state_shardings, sharding.replicated(self.mesh)),
                       donate_argnums=0, compiler_options=options)

    def batch(self, step: int) -> tuple:
        dc, tc, seed = self.config.data, self.config.train, self.config.seed
        return (distributed.put_rows(self.rows, lambda rows: text_data.train_batch(
            self.splits["train"], dc.seq_len, tc.batch_size, seed, step, rows),
            tc.batch_size),)

    def desc(self, n_params: int) -> str:
        variant = getattr(self.model.cfg, "variant", self.config.model.get("family"))
        return f"{variant} ({n_params / 1e6:.2f}M params)"

    def log_record(self, metrics, steps: int, seconds: float) -> dict:
        tc = self.config.train
        record = {"loss": float(metrics["loss"]), "bpb": float(metrics["loss"]) / LN2,
                  "grad_norm": float(metrics["grad_norm"]),
                  "tokens_per_s": steps * tc.batch_size * self.config.data.seq_len / seconds}
        record.update({k: float(v) for k, v in metrics.items() if k.startswith("aux/")})
        record.update(self.hooks.log_fields(metrics, self.model.cfg))
        return record

    def postfix(self, record) -> dict:
        return {"bpb": f"{record['bpb']:.3f}", "tok_s": f"{record['tokens_per_s']:.0f}"}

    def windows(self, split):
        if split not in self._windows:
            self._windows[split] = text_data.eval_windows(
                self.splits[split], self.config.data.seq_len, self.config.eval.windows)
        return self._windows[split]

    def evaluate(self, state, split: str, step: int) -> dict:
        del step
        return self.evaluator(state["params"], self.windows(split), self.config.eval.batch_size)

    def describe(self, result: dict) -> str:
        return self.evaluator.describe(result)

    def finish(self, state, result: dict) -> None:
        """The KV-cache decoder's agreement with the causal forward on test windows."""
        n_dec = self.config.eval.get("decode_check_windows", 0)
        if n_dec:
            result["test"]["decode_agreement"] = self.evaluator.decode_agreement(
                state["params"], self.windows("test")[:n_dec], self.config.eval.batch_size)

    @staticmethod
    def summary(split: str, r: dict) -> str:
        mass = f", gate mass {r['gate_mass']:.4f}" if "gate_mass" in r else ""
        return f"{split}: {r['bpb']:.4f} bits/byte over {r['windows']} windows{mass}"
