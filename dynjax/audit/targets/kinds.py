"""``open_target(path)``: any checkpoint dynjax can read, as one :class:`~dynjax.audit.targets.base.Target`.

The kinds, in the order they are recognised:

- an HF directory whose config.json names a ported ``model_type`` (:class:`HfDir`:
  ``dynjax.loaders.archs.SUPPORTED``; :mod:`dynjax.loaders.hf`);
- an HF directory (``*.safetensors``) whose config.json is MUDDPythia's (model_type
  "muddpythia", or gpt-fast style fields without a model_type): :class:`MuddPythiaDir`;
  any other model_type, or no config.json, is refused in one line (nothing falls through
  to a loader of another architecture);
- a train.py run directory (``config.json`` + orbax ``checkpoints/``): a classifier run
  (:class:`ClassifierRun`, its ``model.family`` is ``gated_mlp``) or a language-model run
  (:class:`LmRun`).

``kind=`` picks one by name instead (audit.py's ``--muddpythia`` / ``--hf`` say which they
expect).
"""
from __future__ import annotations

import json

from dynjax.runs import rundir
from dynjax.loaders import hf, hub, muddpythia_hf
from dynjax.audit.settings import AuditError
from dynjax.errors import CheckpointError
from dynjax.audit.targets.base import Target
from dynjax.audit.targets.hf import HfDir
from dynjax.audit.targets.muddpythia import MuddPythiaDir
from dynjax.audit.targets.train_runs import ClassifierRun, LmRun, read_run_config

KINDS = {k.kind: k for k in (LmRun, ClassifierRun, MuddPythiaDir, HfDir)}


def open_target(path, kind: str | None = None, config=None, step: int | None = None) -> Target:
    """The checkpoint at ``path`` (its kind recognised, or ``kind``). ``config``: the audit
    config, whose section of the kind (``muddpythia``, ``hf``: the dtype weights load in)
    applies; None: the defaults. ``step``: a train.py run's saved step (None: the latest);
    a kind with one set of weights refuses one."""
    path = hub.local_path(path, required=kind in ("hf", "muddpythia"))   # ORG/NAME[@REV]
    if kind is not None:
        if kind not in KINDS:
            raise AuditError(f"unknown checkpoint kind {kind!r}; choose one of {sorted(KINDS)}")
        cls = KINDS[kind]
    elif hf.is_hf_dir(path):
        cls = HfDir
    elif muddpythia_hf.is_hf_dir(path):
        _refuse_foreign(path)
        cls = MuddPythiaDir
    else:
        cls = ClassifierRun if rundir.is_classifier(read_run_config(path)) else LmRun
    return cls(path, config, step)


MUDDPYTHIA_TYPES = ("muddpythia",)


def _refuse_foreign(path) -> None:
    """A safetensors folder that is not MUDDPythia's: one AuditError naming what it is."""
    try:
        config = hf.read_config(str(path))
    except CheckpointError:
        raise AuditError(f"{path} has *.safetensors but no config.json; copy the checkpoint's "
                         "config.json beside its weights") from None
    except (OSError, ValueError) as e:
        raise AuditError(f"{path}/config.json cannot be read ({e}); copy the checkpoint's own "
                         "config.json") from None
    kind = config.get("model_type")
    if kind in MUDDPYTHIA_TYPES or (kind is None and "n_layer" in config):
        return
    raise AuditError(f"{path}/config.json model_type={kind!r} is not supported; supported: "
                     f"{', '.join((*hf.SUPPORTED, *MUDDPYTHIA_TYPES))}")


def check_compatible(targets) -> None:
    """The checkpoints of one audit share their kind and each kind's same-run facts (window
    length, model, training data); else an AuditError naming what differs."""
    kinds = sorted({t.kind for t in targets})
    if len(kinds) > 1:
        raise AuditError(f"the checkpoints are of different kinds ({', '.join(kinds)}); audit "
                         "one kind of checkpoint per run")
    facts = [t.same_run_facts() for t in targets]
    for what in facts[0]:
        values = {json.dumps(f[what], sort_keys=True) for f in facts}
        if len(values) > 1:
            raise AuditError(f"the checkpoints differ in {what} ({sorted(values)}); audit the "
                             "seeds of one model and data configuration together")
