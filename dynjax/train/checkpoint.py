"""Saving and resuming the train state: the write side of a run directory
(:mod:`dynjax.rundir` has the format and the read side: config, steps, parameters alone).

Checkpoints are orbax, periodic, keep-N, written atomically by orbax's temporary-directory
rename.

A checkpoint can still be damaged after it was written (a disk that filled, a copy cut
short, a file deleted by hand). Resuming (:func:`restore_newest`) then falls back to the
newest checkpoint that restores and moves each newer one that does not into
``RUN/unrestorable_checkpoints/`` (kept, not deleted), saying which and why; opening a run
for the audit (:func:`dynjax.rundir.load`) stops with a
:class:`~dynjax.errors.CheckpointError` naming the run, the step and the fix.

On many processes every process calls save and restore (orbax coordinates them; the run
directory must be on a filesystem they share) and each writes or reads the shards its
devices hold. A checkpoint restores onto any mesh and any number of processes: the target
shardings, not the writer's, decide the layout.
"""
from __future__ import annotations

import json
import pathlib
import shutil
import sys

import jax
import orbax.checkpoint as ocp

from dynjax import rundir
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


def try_restore(mngr: ocp.CheckpointManager, abstract_state, step: int):
    """``(state, None)``, or ``(None, why)`` when step ``step`` cannot be restored."""
    try:
        with rundir.guarded_read():
            return restore(mngr, abstract_state, step), None
    except Exception as e:  # noqa: BLE001  orbax/tensorstore raise many types for bad files
        return None, rundir.why(e)


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
