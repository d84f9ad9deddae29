"""The optimizer every task trains with, and the schedule fields every task relies on."""
from __future__ import annotations

import jax
import optax


def schedule(tc) -> optax.Schedule:
    """Linear warm-up from 0 to ``train.lr``, then cosine decay to ``lr * min_lr_ratio``."""
    return optax.warmup_cosine_decay_schedule(
        0.0, tc.lr, tc.warmup_steps, max(tc.steps, tc.warmup_steps + 1),
        end_value=tc.lr * tc.min_lr_ratio)


def learning_rate(tc, step: int) -> float:
    """The learning rate of the update made by 0-based step ``step`` (optax counts updates
    from 0): what the loop logs as ``lr`` with the record of steps done = ``step + 1``."""
    return float(schedule(tc)(step))


def make_optimizer(tc) -> optax.GradientTransformation:
    """AdamW with linear warm-up then cosine decay, after global-norm clipping
    (``train.clip_norm``; 0 turns clipping off: a norm clipped to 0 would train nothing).
    Weight decay applies to matrices only (not norms, gates or biases)."""
    return optax.chain(
        optax.clip_by_global_norm(tc.clip_norm) if tc.clip_norm > 0 else optax.identity(),
        optax.adamw(schedule(tc), b1=tc.b1, b2=tc.b2, eps=tc.get("eps", 1e-8),
                    weight_decay=tc.weight_decay,
                    mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)))


WARMUP_FRACTION = 10   # a clamped warm-up is this fraction (1/10) of the run's steps


def clamp_warmup(config, log=print):
    """``config`` with ``train.warmup_steps`` clamped to a tenth of ``train.steps`` where it
    exceeds them (a short run of a config made for a long one: ``dynjax-train
    --config.train.steps=50`` with the config's 100 warm-up steps), said in one line through
    ``log``; else unchanged. dynjax-train applies it unless the command line sets
    ``train.warmup_steps`` (then a value above the steps is refused, as the library
    refuses it). The clamped value is what config.json records, so a re-run resumes."""
    tc = config.train
    if not 0 < tc.steps < tc.warmup_steps:
        return config
    import ml_collections

    warmup = max(1, tc.steps // WARMUP_FRACTION)
    if log is not None:
        log(f"note: train.warmup_steps={tc.warmup_steps} exceeds train.steps={tc.steps}: "
            f"warming up over {warmup} steps (a tenth of the run); set "
            "--config.train.warmup_steps to choose")
    config = ml_collections.ConfigDict(config.to_dict())
    config.train.warmup_steps = warmup
    return config


def check_train_config(tc) -> None:
    """The schedule and optimizer fields the loop (any task) relies on: a value optax would
    take and train on silently (b2=2, a negative clip) is refused here."""
    for name in ("steps", "batch_size", "log_every", "eval_every", "ckpt_every",
                 "keep_checkpoints"):
        if tc.get(name, 1) <= 0:
            raise ValueError(f"train.{name}={tc[name]} must be positive")
    if not 0 < tc.lr < 1:
        raise ValueError(f"train.lr={tc.lr} is outside (0, 1)")
    for name in ("b1", "b2"):
        if not 0 <= tc[name] < 1:
            raise ValueError(f"train.{name}={tc[name]} must be in [0, 1) (Adam's decay rate; "
                             "the usual values are b1=0.9, b2=0.95-0.999)")
    if not tc.get("eps", 1e-8) > 0:
        raise ValueError(f"train.eps={tc.eps} must be positive (Adam's denominator guard)")
    if not tc.clip_norm >= 0:
        raise ValueError(f"train.clip_norm={tc.clip_norm} must be >= 0 (0: no clipping)")
    if not tc.weight_decay >= 0:
        raise ValueError(f"train.weight_decay={tc.weight_decay} must be >= 0")
    if not 0 <= tc.min_lr_ratio <= 1:
        raise ValueError(f"train.min_lr_ratio={tc.min_lr_ratio} must be in [0, 1]")
    if not 0 <= tc.warmup_steps <= tc.steps:
        raise ValueError(f"train.warmup_steps={tc.warmup_steps} must be in [0, "
                         f"train.steps={tc.steps}]")
    if not tc.get("max_skipped_in_a_row", 0) >= 0:
        raise ValueError(f"train.max_skipped_in_a_row={tc.max_skipped_in_a_row} must be >= 0")
    if not tc.get("spike_factor", 0) >= 0:
        raise ValueError(f"train.spike_factor={tc.spike_factor} must be >= 0 (0: no "
                         "loss-spike warning)")
