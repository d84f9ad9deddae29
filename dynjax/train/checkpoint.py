"""Orbax checkpoints of the train state, plus the resolved config saved beside them.

A run directory holds ``config.json`` (the resolved config), ``checkpoints/<step>/`` (orbax,
periodic, keep-N, written atomically by orbax's temporary-directory rename),
``metrics.jsonl`` and ``eval.json``. ``load_params`` is what the audit uses to open a run.
"""
from __future__ import annotations

import json
import pathlib

import jax
import ml_collections
import orbax.checkpoint as ocp


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


def read_config(run_dir) -> ml_collections.ConfigDict:
    path = pathlib.Path(run_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: {run_dir} is not a dynjax run directory "
                                "(train.py writes config.json beside the checkpoints)")
    return ml_collections.ConfigDict(json.loads(path.read_text()))


def load_params(run_dir, step=None):
    """(config, model, params) of a finished or running run, params on the default device."""
    from dynjax.models import build  # local: checkpoint I/O does not need models at import
    from dynjax.train import loop

    config = read_config(run_dir)
    model = build(config.model.to_dict())
    mngr = manager(run_dir, every=1, keep=1_000_000)
    if mngr.latest_step() is None:
        raise FileNotFoundError(f"no checkpoint under {run_dir}/checkpoints; train it first")
    abstract = jax.eval_shape(lambda: loop.init_state(config, model, jax.random.key(0)))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device),
                            abstract)
    state = restore(mngr, abstract, step)
    return config, model, state["params"]
