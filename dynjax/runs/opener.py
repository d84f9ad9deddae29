"""``open_checkpoint(spec)``: the one place that tells what a checkpoint argument names.

Conversion (``train.init_from``), the sampler and the audit's targets all recognise their
argument here, so they agree on every kind; the rules, in order: docs/targets.md.
"""
from __future__ import annotations

import dataclasses
import glob
import os
import pathlib

import ml_collections

from dynjax.errors import CheckpointError
from dynjax.jsonio import read_json
from dynjax.loaders import archs, hf, hub
from dynjax.runs import rundir

RUN_KINDS = ("lm_run", "classifier_run")        # train.py run directories: steps to choose
ONE_SET_KINDS = ("hf", "muddpythia")            # one set of weights each
KINDS = RUN_KINDS + ONE_SET_KINDS
MUDDPYTHIA_TYPES = ("muddpythia",)
NAMES = {"hf": "Hugging Face", "muddpythia": "MUDDPythia"}


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """A recognised checkpoint: its ``kind`` (one of :data:`KINDS`), local directory,
    requested step (a run's saved step; None: the latest, or a kind with one set of
    weights) and its config.json (a run's as a ConfigDict, an HF directory's as a dict)."""

    kind: str
    path: pathlib.Path
    step: int | None
    config: object

    @property
    def is_run(self) -> bool:
        return self.kind in RUN_KINDS


def split_step(spec) -> tuple[str, int | None]:
    """``RUN:STEP`` -> ``("RUN", STEP)``; anything else (an existing path included) as it is."""
    spec = os.fspath(spec)
    head, _, tail = spec.rpartition(":")
    if head and tail.isdigit() and not os.path.exists(spec):
        return head, int(tail)
    return spec, None


def _has_safetensors(path: pathlib.Path) -> bool:
    return bool(glob.glob(os.path.join(path, "*.safetensors")))


def _missing(spec: str, path: pathlib.Path, kind: str | None, train: str | None) -> CheckpointError:
    if hub.is_repo_id(spec) and kind in ONE_SET_KINDS:
        try:
            hub.resolve(spec)       # raises the cache's own line (where it looked, the fix)
        except CheckpointError as e:
            return e
    train = train or f"train.py ... --workdir={path}"
    return CheckpointError(
        f"{path} does not exist; give a train.py run directory (RUN or RUN:STEP: train one "
        f"first, e.g. `{train}`), a Hugging Face checkpoint directory (config.json + "
        f"*.safetensors), or a repo id ORG/NAME cached under {hub.cache_dir()}")


def recognise(path: pathlib.Path, config) -> str:
    """The kind of the directory ``path`` whose config.json is ``config`` (None: it has
    none); a CheckpointError naming what it is and the fix when it is no checkpoint dynjax
    reads."""
    if config is None:
        if _has_safetensors(path):
            raise CheckpointError(f"{path} has *.safetensors but no config.json; copy the "
                                  "checkpoint's config.json beside its weights")
        raise CheckpointError(f"{path} has no config.json, so it is neither a train.py run "
                              "directory nor a Hugging Face checkpoint; point at the folder "
                              "train.py --workdir wrote, or at an HF checkpoint directory")
    model_type = config.get("model_type")
    if model_type in archs.ARCHS or model_type in hf.NOT_YET:
        return "hf"
    if model_type in MUDDPYTHIA_TYPES or (model_type is None and "n_layer" in config
                                          and _has_safetensors(path)):
        return "muddpythia"
    if model_type is not None:
        raise CheckpointError(f"{path}/config.json model_type={model_type!r} is not supported; "
                              f"supported: {', '.join((*hf.SUPPORTED, *MUDDPYTHIA_TYPES))}")
    if isinstance(config.get("model"), dict) and isinstance(config.get("data"), dict):
        return "classifier_run" if rundir.is_classifier(ml_collections.ConfigDict(config)) \
            else "lm_run"
    raise CheckpointError(f"{path}/config.json is neither a train.py run's (model and data "
                          "sections) nor a Hugging Face checkpoint's (a model_type); point at "
                          "a run directory or an HF checkpoint directory")


def open_checkpoint(spec, kind: str | None = None, step: int | None = None,
                    train: str | None = None) -> Checkpoint:
    """The checkpoint ``spec`` names: a train.py run directory (``RUN``, or ``RUN:STEP`` for
    a saved step), a Hugging Face checkpoint directory of a ported ``model_type``, a
    MUDDPythia directory, or a repo id ``ORG/NAME[@REV]`` in the local Hugging Face cache.
    Reads config.json only (no weights). ``kind``: the kind the caller insists on (one of
    :data:`KINDS`); ``step``: a run's saved step (as ``:STEP`` does); ``train``: the command
    that would train a missing run, as the caller's program words it. Anything else is one
    :class:`CheckpointError` naming the problem and the fix."""
    if kind is not None and kind not in KINDS:
        raise CheckpointError(f"unknown checkpoint kind {kind!r}; choose one of {list(KINDS)}")
    spec, spec_step = split_step(spec)
    if spec_step is not None and step is not None and spec_step != step:
        raise CheckpointError(f"{spec}:{spec_step} names step {spec_step} and the step "
                              f"argument is {step}; give one of them")
    step = spec_step if step is None else step
    path = pathlib.Path(hub.local_path(spec, required=kind in ONE_SET_KINDS))
    if not path.is_dir():
        raise _missing(spec, path, kind, train)
    config_file = path / rundir.CONFIG
    config = read_json(config_file, fix="copy the checkpoint's config.json again") \
        if config_file.exists() else None
    found = recognise(path, config)
    if kind is not None and kind != found:
        raise CheckpointError(f"{path} is a {found} checkpoint, not {kind}; drop the kind "
                              f"(it is recognised) or point at a {kind} checkpoint")
    if found in ONE_SET_KINDS:
        if step is not None:
            raise CheckpointError(f"{path} is a {NAMES[found]} directory and holds one set "
                                  f"of weights; drop the step ({step}: --step, :STEP)")
        return Checkpoint(found, path, None, config)
    if step is not None:
        saved = rundir.steps(path)
        if int(step) not in saved:
            raise CheckpointError(f"run {path} has no checkpoint step {step} (saved: "
                                  f"{', '.join(map(str, saved)) or 'none'}); pass one of them")
        step = int(step)
    return Checkpoint(found, path, step, ml_collections.ConfigDict(config))
