"""Saving and resuming the train state: the write side of a run directory
(:mod:`dynjax.runs.rundir` has the format and the read side).

Orbax checkpoints, periodic, keep-N, renamed into place whole; each save records every
array's digest (:mod:`dynjax.runs.integrity`) and refuses a non-finite state
(:class:`NonFiniteState`). Resuming (:func:`restore_newest`) falls back to the newest
checkpoint that verifies and moves damaged ones aside. Details: docs/reliability.md.
"""
from __future__ import annotations

import errno
import json
import os
import pathlib
import re
import shutil
import time

import jax
import orbax.checkpoint as ocp
from etils import epath

from dynjax import models
from dynjax.runs import integrity, rundir
from dynjax.train import preempt
from dynjax.errors import CheckpointError, ConfigError
from dynjax.jsonio import is_local, read_json

UNRESTORABLE = "unrestorable_checkpoints"
HISTORY = "config_history.jsonl"
# train.* fields that do not change what is trained: never a difference between runs
NOT_COMPARED = ("allow_changes", "init_from")   # init_from: train/convert.py names a changed source
# fields a config file gained after runs were made with it, and the value those runs had (the
# model's default): absent from a run's config.json and equal to it here, not a difference
ADDED_LATER = {"model.moe_dispatch": "onehot"}   # configs/mode_tiny.py, moe_tiny.py


class NonFiniteState(ValueError):
    """The state to save has a non-finite entry; nothing was written."""


def manager(run_dir, every: int, keep: int) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=every,
                                           enable_async_checkpointing=False)
    root = epath.Path(run_dir)   # orbax's own path type: a local folder or gs://...
    return ocp.CheckpointManager((root.resolve() if is_local(root) else root) / "checkpoints",
                                 options=options)


def will_save(mngr: ocp.CheckpointManager, step: int, force=False) -> bool:
    return force or mngr.should_save(step)


def save(mngr: ocp.CheckpointManager, step: int, state, force=False) -> bool:
    """Save ``state`` as step ``step`` if the cadence (or ``force``) says so, with its
    digests. A non-finite state raises :class:`NonFiniteState` and writes nothing."""
    if not will_save(mngr, step, force):
        return False
    sums, bad = integrity.digest(state)
    if bad:
        raise NonFiniteState(f"non-finite values in {bad[0]}"
                             + (f" and {len(bad) - 1} more arrays" if len(bad) > 1 else ""))
    folder = pathlib.Path(mngr.directory)
    try:
        with rundir.guarded_read():   # a failed write's I/O threads print tracebacks to fd 2
            # the digests go into the step's metadata, committed with the arrays
            saved = mngr.save(step, args=ocp.args.StandardSave(state), force=True,
                              custom_metadata=integrity.metadata(sums))
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001  tensorstore reports a full disk as a ValueError
        raise _as_os_error(e, folder, step) from None
    return saved


def _as_os_error(e: BaseException, folder, step: int) -> BaseException:
    """orbax/tensorstore's write failure as the OSError it wraps (errno from the message)."""
    inner = e
    while (inner.__cause__ or inner.__context__) is not None:
        inner = inner.__cause__ or inner.__context__
    line = f"{e} {inner}"
    m = re.search(r"os_error_code='(\d+)'", line)
    code = int(m.group(1)) if m else (errno.ENOSPC if "No space left" in line else None)
    if code is None:
        return e
    return OSError(code, f"{os.strerror(code)} (saving checkpoint step {step})", str(folder))


def restore(mngr: ocp.CheckpointManager, abstract_state, step=None):
    """Restore onto the shardings of ``abstract_state`` (ShapeDtypeStructs with .sharding)."""
    step = mngr.latest_step() if step is None else step
    return mngr.restore(step, args=ocp.args.StandardRestore(abstract_state))


def try_restore(mngr: ocp.CheckpointManager, abstract_state, step: int):
    """``(state, None)``, or ``(None, why)`` when step ``step`` cannot be restored, or what
    it restores is not what was saved (digests) or not finite."""
    try:
        with rundir.guarded_read():
            state = restore(mngr, abstract_state, step)
    except Exception as e:  # noqa: BLE001  orbax/tensorstore raise many types for bad files
        return None, rundir.why(e)
    why = integrity.check(pathlib.Path(mngr.directory) / str(step), state)
    return (None, why) if why else (state, None)


def restore_newest(mngr: ocp.CheckpointManager, abstract_state, run_dir, log=None):
    """Restore the newest checkpoint of ``run_dir`` that restores and is verified.

    Each newer step that fails is moved to ``RUN/unrestorable_checkpoints/STEP`` (so the
    run continues from the older one and saves that step again) and named in a warning with
    the reason; so is a newer step without readable digests (it cannot be verified: an
    older verified one is preferred). Only when no verified step restores is an unverified
    one restored, with a warning. If no step restores, nothing is moved and a
    CheckpointError says why.
    """
    log = log or preempt.say
    folder = pathlib.Path(mngr.directory)
    failed, unverified = [], []
    for step in sorted(mngr.all_steps(), reverse=True):
        if integrity.recorded(folder / str(step)) is None:
            unverified.append(step)
            continue
        state, why = try_restore(mngr, abstract_state, step)
        if state is None:
            failed.append((step, why))
            continue
        return _resumed(mngr, run_dir, state, step,
                        failed + [(s, integrity.UNVERIFIED) for s in unverified], log)
    for step in unverified:                    # newest first
        state, why = try_restore(mngr, abstract_state, step)
        if state is None:
            failed.append((step, why))
            continue
        if jax.process_index() == 0:
            log(f"warning: checkpoint step {step} of {run_dir} has no readable digests: "
                "restored unverified (no older verified checkpoint restores)")
        return _resumed(mngr, run_dir, state, step, [f for f in failed if f[0] > step], log)
    raise CheckpointError(
        f"no checkpoint of {run_dir} can be restored ("
        + "; ".join(f"step {s}: {why}" for s, why in sorted(failed, reverse=True))
        + f"); delete {pathlib.Path(run_dir) / 'checkpoints'} and {run_dir}/metrics.jsonl "
        "to train the run from the start")


def _resumed(mngr, run_dir, state, step: int, failed, log):
    """``state`` (restored from ``step``), after moving each newer ``failed`` step aside."""
    for bad, why in sorted(failed, reverse=True):
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


def _set_aside(run_dir, step: int) -> pathlib.Path:
    root = pathlib.Path(run_dir) / UNRESTORABLE
    root.mkdir(exist_ok=True)
    dest, i = root / str(step), 1
    while dest.exists():
        dest, i = root / f"{step}.{i}", i + 1
    shutil.move(str(pathlib.Path(run_dir) / "checkpoints" / str(step)), dest)
    return dest


def check_same_run(run_dir, config, keys=None) -> list[str]:
    """Refuse to resume ``run_dir`` if its config.json differs from ``config`` (in ``keys``,
    or anywhere but ``train``); the message names the fields that differ. A changed
    ``train.*`` field is refused too, unless ``train.allow_changes``: then the changes are
    returned (for :func:`record_changes`), and config.json keeps how the run began."""
    path = pathlib.Path(run_dir) / rundir.CONFIG
    if not path.exists():
        return []
    old = read_json(path, fix=(
        "config.json records how the run was made: restore it from a copy, or delete "
        f"{run_dir} to train the run from the start"))
    new = json.loads(json.dumps(config.to_dict()))
    if isinstance(old.get("model"), dict):   # a renamed field compares under today's name
        old["model"] = models.canonical(old["model"])
    keys = [k for k in (keys or sorted(set(old) | set(new))) if k != "train"]
    diffs = [d for k in keys for d in _diff(old.get(k), new.get(k), k)]
    if diffs:
        raise ConfigError(f"{run_dir} holds a run trained with a different config "
                          f"({_shown(diffs)}); use a new --workdir (scripts/main.sh: "
                          f"RUN=NEW_DIR), or delete {run_dir} to start over")
    old_t, new_t = effective_train(run_dir, old.get("train", {})), new.get("train", {})
    changes = [d for k in sorted(new_t) if k in old_t and k not in NOT_COMPARED
               for d in _diff(old_t[k], new_t[k], f"train.{k}")]
    if changes and not new_t.get("allow_changes", False):
        raise ConfigError(f"{run_dir} was trained with other train settings ({_shown(changes)})"
                          "; resume with the run's values, or pass "
                          "--config.train.allow_changes=true to change them (recorded in "
                          f"{pathlib.Path(run_dir) / HISTORY}; config.json keeps the original)")
    return changes


def effective_train(run_dir, original: dict) -> dict:
    """The ``train`` fields the run trains with now: config.json's, or the last accepted
    change's (``config_history.jsonl``). A torn last line (a kill during the append) is
    dropped with a warning: the change it recorded is not in force."""
    from dynjax.train.metrics import read_records

    history = read_records(epath.Path(run_dir) / HISTORY,
                           warn=preempt.say)
    return history[-1]["train"] if history else original


def record_changes(run_dir, step: int, changes: list[str], config) -> None:
    """Append accepted ``train.*`` changes (and the ``train`` fields now in force) to
    ``RUN/config_history.jsonl``; the loop calls it once the first checkpoint under them is
    saved, so the record never holds a change no checkpoint was trained with. ``step``: the
    resumed step, from which the changes are in force."""
    from dynjax.train.metrics import append_line

    append_line(epath.Path(run_dir) / HISTORY,
                {"step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "changes": changes, "train": config.train.to_dict()})


def _shown(diffs: list[str]) -> str:
    return "; ".join(diffs[:3]) + (f"; {len(diffs) - 3} more" if len(diffs) > 3 else "")


def _added_later(old: dict, new: dict, key: str, where: str) -> bool:
    """``key`` is an :data:`ADDED_LATER` field the run predates, at the value it had."""
    name = f"{where}.{key}"
    return key not in old and name in ADDED_LATER and new.get(key) == ADDED_LATER[name]


def _diff(old, new, where: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new)) if not _added_later(old, new, k, where)
                for d in _diff(old.get(k), new.get(k), f"{where}.{k}")]
    return [] if old == new else [f"{where}: run has {old!r}, config has {new!r}"]
