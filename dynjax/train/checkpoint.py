"""Orbax checkpoints of the train state, plus the resolved config saved beside them.

A run directory holds ``config.json`` (the resolved config), ``checkpoints/<step>/`` (orbax,
periodic, keep-N, written atomically by orbax's temporary-directory rename),
``metrics.jsonl`` and ``eval.json``. ``load_params`` is what the audit uses to open a run.

A checkpoint can still be damaged after it was written (a disk that filled, a copy cut
short, a file deleted by hand). Resuming (:func:`restore_newest`) then falls back to the
newest checkpoint that restores and moves each newer one that does not into
``RUN/unrestorable_checkpoints/`` (kept, not deleted), saying which and why; the audit
(:func:`load_params`) stops with a :class:`~dynjax.errors.CheckpointError` naming the run,
the step and the fix.

On many processes every process calls save and restore (orbax coordinates them; the run
directory must be on a filesystem they share) and each writes or reads the shards its
devices hold. A checkpoint restores onto any mesh and any number of processes: the target
shardings, not the writer's, decide the layout.
"""
from __future__ import annotations

import contextlib
import json
import logging
import pathlib
import shutil
import sys

import jax
import ml_collections
import orbax.checkpoint as ocp

from dynjax.errors import CheckpointError, ConfigError

UNRESTORABLE = "unrestorable_checkpoints"


def manager(run_dir, every: int, keep: int) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=every,
                                           enable_async_checkpointing=False)
    return ocp.CheckpointManager(pathlib.Path(run_dir).resolve() / "checkpoints",
                                 options=options)


def save(mngr: ocp.CheckpointManager, step: int, state, force=False) -> bool:
    return mngr.save(step, args=ocp.args.StandardSave(state), force=force)


def restore(mngr: ocp.CheckpointManager, abstract_state, step=None):
    """Restore onto the shardings of ``abstract_state`` (ShapeDtypeStructs with .sharding)."""
    step = mngr.latest_step() if step is None else step
    return mngr.restore(step, args=ocp.args.StandardRestore(abstract_state))


def _why(e: BaseException) -> str:
    """A damaged checkpoint's error in one short line: the innermost cause, which names the
    file and what is wrong with it (orbax wraps it in a message that dumps a TensorStore)."""
    while (e.__cause__ or e.__context__) is not None:
        e = e.__cause__ or e.__context__
    line = " ".join(str(e).split()) or type(e).__name__
    return line if len(line) <= 240 else line[:237] + "..."


@contextlib.contextmanager
def _quiet_asyncio():
    """orbax logs a failed read's orphaned futures through asyncio at ERROR; the failure
    itself is what we report."""
    log = logging.getLogger("asyncio")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def try_restore(mngr: ocp.CheckpointManager, abstract_state, step: int):
    """``(state, None)``, or ``(None, why)`` when step ``step`` cannot be restored."""
    try:
        with _quiet_asyncio():
            return restore(mngr, abstract_state, step), None
    except Exception as e:  # noqa: BLE001  orbax/tensorstore raise many types for bad files
        return None, _why(e)


def restore_newest(mngr: ocp.CheckpointManager, abstract_state, run_dir, log=None):
    """Restore the newest checkpoint of ``run_dir`` that restores.

    Each newer step that fails is moved to ``RUN/unrestorable_checkpoints/STEP`` (so the
    run continues from the older one and saves that step again) and named in a warning with
    the reason. If no step restores, nothing is moved and a CheckpointError says why.
    """
    log = log or (lambda line: print(line, file=sys.stderr))
    failed = []
    for step in sorted(mngr.all_steps(), reverse=True):
        state, why = try_restore(mngr, abstract_state, step)
        if state is None:
            failed.append((step, why))
            continue
        for bad, why in failed:
            if jax.process_index() == 0:   # one process moves the shared directory
                dest = _set_aside(run_dir, bad)
                log(f"warning: checkpoint step {bad} of {run_dir} cannot be restored ({why}); "
                    f"moved it to {dest} and resumed from step {step}, the newest that restores")
        if failed:
            if jax.process_count() > 1:
                from jax.experimental import multihost_utils
                multihost_utils.sync_global_devices("dynjax_set_aside")
            mngr.reload()
        return state
    raise CheckpointError(
        f"no checkpoint of {run_dir} can be restored ("
        + "; ".join(f"step {s}: {why}" for s, why in failed)
        + f"); delete {pathlib.Path(run_dir) / 'checkpoints'} and {run_dir}/metrics.jsonl "
        "to train the run from the start")


def _set_aside(run_dir, step: int) -> pathlib.Path:
    root = pathlib.Path(run_dir) / UNRESTORABLE
    root.mkdir(exist_ok=True)
    dest, i = root / str(step), 1
    while dest.exists():
        dest, i = root / f"{step}.{i}", i + 1
    shutil.move(str(pathlib.Path(run_dir) / "checkpoints" / str(step)), dest)
    return dest


def check_same_run(run_dir, config, keys=None) -> None:
    """Refuse to resume ``run_dir`` if its config.json differs from ``config`` (in ``keys``,
    or anywhere); the message names the fields that differ."""
    path = pathlib.Path(run_dir) / "config.json"
    if not path.exists():
        return
    old, new = json.loads(path.read_text()), json.loads(json.dumps(config.to_dict()))
    keys = keys or sorted(set(old) | set(new))
    diffs = [d for k in keys for d in _diff(old.get(k), new.get(k), k)]
    if diffs:
        shown = "; ".join(diffs[:3]) + (f"; {len(diffs) - 3} more" if len(diffs) > 3 else "")
        raise ConfigError(f"{run_dir} holds a run trained with a different config ({shown}); "
                          "use a new --workdir (scripts/main.sh: RUN=NEW_DIR), or delete "
                          f"{run_dir} to start over")


def _diff(old, new, where: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new))
                for d in _diff(old.get(k), new.get(k), f"{where}.{k}")]
    return [] if old == new else [f"{where}: run has {old!r}, config has {new!r}"]


def read_config(run_dir) -> ml_collections.ConfigDict:
    path = pathlib.Path(run_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: {run_dir} is not a dynjax run directory "
                                "(train.py writes config.json beside the checkpoints)")
    return ml_collections.ConfigDict(json.loads(path.read_text()))


def load_params(run_dir, step=None, with_step=False):
    """(config, model, params) of a finished or running run, params on the default device;
    with ``with_step`` also the step restored."""
    from dynjax.models import build  # local: checkpoint I/O does not need models at import
    from dynjax.train import loop

    config = read_config(run_dir)
    model = build(config.model.to_dict())
    abstract = jax.eval_shape(lambda: loop.init_state(config, model, jax.random.key(0)))
    state, step = restore_for_audit(run_dir, abstract, step)
    return (config, model, state["params"]) + ((step,) if with_step else ())


def restore_for_audit(run_dir, abstract_state, step=None):
    """``(state, step)``: ``step`` (default the latest) restored onto this process's first
    device (every process of a multi-host audit holds its own copy). A checkpoint that does
    not restore is a CheckpointError naming the run, step and fix."""
    mngr = manager(run_dir, every=1, keep=1_000_000)
    step = mngr.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"no checkpoint under {run_dir}/checkpoints; train it first")
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract_state = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device), abstract_state)
    state, why = try_restore(mngr, abstract_state, step)
    if state is None:
        raise CheckpointError(
            f"checkpoint step {step} of run {run_dir} cannot be restored ({why}); re-run its "
            f"train.py / train_mlp.py command with --workdir={run_dir}: it moves the damaged "
            "step aside, resumes from the newest checkpoint that restores and saves the final "
            "step again")
    return state, step
