"""The optimizer every task trains with, and the schedule fields every task relies on."""
from __future__ import annotations

import jax
import optax


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


def check_train_config(tc) -> None:
    """The schedule fields the loop (any task) relies on."""
    for name in ("steps", "batch_size", "log_every", "eval_every", "ckpt_every"):
        if tc[name] <= 0:
            raise ValueError(f"train.{name}={tc[name]} must be positive")
    if not 0 < tc.lr < 1:
        raise ValueError(f"train.lr={tc.lr} is outside (0, 1)")
