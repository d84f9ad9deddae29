"""The run directory's format, and reading one back without any training code.

A run directory (written by ``train.py``) holds config.json, orbax ``checkpoints/S/`` (with
each array's digest: :mod:`dynjax.runs.integrity`), metrics.jsonl, eval.json and
config_history.jsonl. Reading parameters restores only the ``params`` subtree, so opening
a run needs its model, not its optimizer, and the audit never imports the trainer. The
files one by one: docs/training.md (The run directory's format).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import dataclasses
import logging
import os
import pathlib
import sys
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import ml_collections
import orbax.checkpoint as ocp

from dynjax.errors import CheckpointError
from dynjax.jsonio import read_json

CONFIG, CHECKPOINTS, METRICS, EVAL = "config.json", "checkpoints", "metrics.jsonl", "eval.json"
STATE_ITEM = "default"   # the item name orbax's CheckpointManager gives a single-item save


# ------------------------------------------------------------------------------ config

def read_config(run_dir) -> ml_collections.ConfigDict:
    path = pathlib.Path(run_dir) / CONFIG
    if not path.exists():
        raise CheckpointError(f"{path} not found: {run_dir} is not a dynjax run directory "
                                "(train.py writes config.json beside the checkpoints)")
    return ml_collections.ConfigDict(read_json(path, fix=(
        "config.json records how the run was made; restore it from a copy (or re-create it "
        "with the run's train.py command in a new --workdir and copy its config.json here)")))


def read_eval(run_dir) -> dict | None:
    """The run's eval.json, or None while training is unfinished."""
    path = pathlib.Path(run_dir) / EVAL
    return read_json(path, fix=(
        f"delete it and re-run the run's train.py command with --workdir={run_dir}: it "
        "evaluates the final checkpoint again")) if path.exists() else None


CLASSIFIER_FAMILY = "gated_mlp"


def is_classifier(config) -> bool:
    """Classifier runs (DynamicGate-MLP and its baselines) record ``model.family`` =
    ``gated_mlp``; runs written before the family was recorded are told by their
    ``data.dataset`` (language-model runs name a text ``data.source``)."""
    family = config.model.get("family")
    return family == CLASSIFIER_FAMILY if family else "dataset" in config.data


def with_recorded_family(config, run_dir):
    """``config`` with a classifier's ``model.family`` recorded, as config.json keeps it;
    unchanged when ``run_dir`` holds a run written before the family was recorded (its
    config.json is never rewritten on resume)."""
    if config.model.get("family") or not is_classifier(config):
        return config
    old = pathlib.Path(run_dir) / CONFIG
    if old.exists() and "family" not in json.loads(old.read_text()).get("model", {}):
        return config
    config = ml_collections.ConfigDict(config.to_dict())
    config.model.family = CLASSIFIER_FAMILY
    return config


def family_variant(config) -> tuple[str, str]:
    if is_classifier(config):
        return "gated_mlp", config.model.variant
    if "variant" not in config.model:   # the llm family: what its layers route
        return config.model.family, model_of(config).cfg.variant
    return config.model.family, config.model.variant


# ------------------------------------------------------------------------------ the model

def tfds_keys(data_config) -> tuple:
    """A classifier run's TFDS input and label feature names (used only for ``tfds:`` data)."""
    return data_config.get("tfds_input_key"), data_config.get("tfds_label_key", "label")


def load_classifier_data(data_config) -> dict:
    """A classifier run's ``{split: (x, y)}`` (tabular/image data, or a prepared TFDS set)."""
    from dynjax.data import tabular

    return tabular.load(data_config.dataset, data_config.get("data_dir"),
                        *tfds_keys(data_config))


def classifier_model_dict(config, in_dim: int, n_classes: int) -> dict:
    """The GatedMLP config of a run: its model fields plus the data's input and class sizes."""
    d = dict(config.model.to_dict())
    d.pop("family", None)
    d["hidden"] = tuple(d["hidden"])
    return {**d, "in_dim": in_dim, "n_classes": n_classes}


def model_of(config, splits=None):
    """The model a run trains. A classifier's input and class counts come from its data
    (``splits``, loaded when not given)."""
    from dynjax.models import build

    if not is_classifier(config):
        return build(config.model.to_dict())
    from dynjax.data import tabular

    splits = load_classifier_data(config.data) if splits is None else splits
    return build(dict(classifier_model_dict(config, splits["train"][0].shape[1],
                                            tabular.num_classes(splits)), family="gated_mlp"))


def example_input(config, model) -> jax.Array:
    """One example of the model's input (a token window, or a feature vector)."""
    if is_classifier(config):
        return jnp.zeros((1, model.cfg.in_dim), jnp.float32)
    return jnp.zeros((1, config.data.seq_len), jnp.int32)


# ------------------------------------------------------------------------------ checkpoints

def steps(run_dir) -> list[int]:
    """The saved steps of a run, oldest first (finished saves only: orbax writes a step
    under a temporary name and renames it when complete)."""
    root = pathlib.Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())


def why(e: BaseException) -> str:
    """A damaged checkpoint's error in one short line: the innermost cause, which names the
    file and what is wrong with it (orbax wraps it in a message that dumps a TensorStore)."""
    while (e.__cause__ or e.__context__) is not None:
        e = e.__cause__ or e.__context__
    line = " ".join(str(e).split()) or type(e).__name__
    return line if len(line) <= 240 else line[:237] + "..."


@contextlib.contextmanager
def quiet_asyncio():
    """orbax logs a failed read's orphaned futures through asyncio at ERROR; the failure
    itself is what we report."""
    log = logging.getLogger("asyncio")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


@contextlib.contextmanager
def guarded_read():
    """Run a checkpoint read so that a failure is one line, and a success loses nothing.

    A failed read leaves tensorstore reads in flight whose callbacks find orbax's event loop
    closed and print tracebacks from I/O threads straight to file descriptor 2, around the
    one line we report. So file descriptor 2 goes to a temporary file while the read runs:
    on success what was written there (warnings, say) is passed on to the real stderr; on
    failure the stragglers get a second to finish, and their output is dropped."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            with quiet_asyncio():
                yield
        except BaseException:
            time.sleep(1.0)
            raise
        else:
            captured.seek(0)
            os.write(saved, captured.read())
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def restore_params(run_dir, abstract_params, step: int):
    """The ``params`` subtree of step ``step``, onto ``abstract_params``' shapes, dtypes and
    shardings (ShapeDtypeStructs with .sharding); the optimizer state is not read. A
    checkpoint that does not restore is a CheckpointError naming the run, step and fix."""
    restore_args = jax.tree.map(
        lambda s: ocp.ArrayRestoreArgs(sharding=s.sharding, global_shape=s.shape,
                                       dtype=s.dtype), abstract_params)
    path = (pathlib.Path(run_dir) / CHECKPOINTS / str(step) / STATE_ITEM).resolve()
    from dynjax.runs import integrity

    try:
        with guarded_read(), ocp.PyTreeCheckpointer() as ckptr:
            params = ckptr.restore(path, args=ocp.args.PyTreeRestore(
                item={"params": abstract_params}, restore_args={"params": restore_args},
                partial_restore=True))["params"]
        bad = integrity.check(path.parent, {"params": params})
    except Exception as e:  # noqa: BLE001  orbax/tensorstore raise many types for bad files
        bad = why(e)
    if bad is None:
        if integrity.recorded(path.parent) is None:
            print(f"warning: checkpoint step {step} of run {run_dir} has no readable digests: "
                  f"restored unverified ({integrity.UNVERIFIED})", file=sys.stderr)
        return params
    if "not compatible with the stored shape" in bad:   # not damage: another model
        raise CheckpointError(
            f"checkpoint step {step} of run {run_dir} does not match config.json's model "
            f"({bad}): config.json was changed after training; restore it from a copy (the "
            "checkpoint is not damaged, and re-running train.py would not help)")
    raise CheckpointError(
        f"checkpoint step {step} of run {run_dir} cannot be restored ({bad}); re-run "
        f"its train.py command with --workdir={run_dir}: it moves the damaged step "
        "aside, resumes from the newest checkpoint that restores and saves the final "
        "step again")


@dataclasses.dataclass(frozen=True)
class Run:
    """A run opened at one checkpoint: its config, model, parameters and step."""
    config: Any
    model: Any
    params: Any
    step: int


def load(run_dir, step=None, splits=None) -> Run:
    """Open a run at ``step`` (default the latest), parameters on this process's first
    device (every process of a multi-host audit holds its own copy). ``splits``: a
    classifier run's data, when the caller has it loaded already."""
    config = read_config(run_dir)
    model = model_of(config, splits)
    saved = steps(run_dir)
    step = (saved[-1] if saved else None) if step is None else int(step)
    if step is None:
        raise CheckpointError(f"no checkpoint under {run_dir}/{CHECKPOINTS}; train it first")
    if step not in saved:
        raise CheckpointError(f"run {run_dir} has no checkpoint step {step} (saved: "
                              f"{', '.join(map(str, saved)) or 'none'}); pass one of them")
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    x = example_input(config, model)
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device),
                            jax.eval_shape(lambda: model.init(jax.random.key(0), x)))
    return Run(config, model, restore_params(run_dir, abstract, step), step)


def load_params(run_dir, step=None):
    """``(config, model, params)`` of a run at ``step`` (default the latest)."""
    run = load(run_dir, step)
    return run.config, run.model, run.params


def params_sha256(params) -> str:
    """sha256 over every parameter's path, dtype, shape and bytes (order-independent of dicts)."""
    h = hashlib.sha256()
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    for path, leaf in sorted(flat, key=lambda pl: jax.tree_util.keystr(pl[0])):
        a = np.asarray(jax.device_get(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{a.dtype}|{a.shape}|".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()
