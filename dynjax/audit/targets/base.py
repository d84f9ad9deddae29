"""What every kind of checkpoint offers the audit and the scorecard (:class:`Target`).

A kind (a train.py language-model run, a classifier run, an HF directory) is a subclass that
says how to open it; the programs read only this interface, so a new kind of checkpoint is
a new class, not a new branch in each program. Opening is cheap: the config is read and the
model built at once (so every check runs before any weights load); the parameters load on
first use.
"""
from __future__ import annotations

import functools
import pathlib

import jax
import numpy as np

from dynjax.coeffs import is_axes
from dynjax.audit import plan as audit_plan
from dynjax.errors import AuditError
from dynjax.runs.rundir import params_sha256
from dynjax.tasks import LM, Task


class Target:
    """One checkpoint: model, parameters, task, windows and execution panel.

    Subclasses set ``kind`` (the name ``open_target(kind=...)`` takes), ``task``,
    ``baseline`` (what its execution is timed against), ``saves_steps`` (a train.py run keeps
    a checkpoint per saved step; a directory of weights holds one), and implement ``_load``
    (the parameters and their facts), ``windows``, ``execution`` and, for language models the
    sampler reads, ``text``.
    """

    kind = ""
    task: Task = LM
    baseline = "its dense twin"
    saves_steps = False

    def __init__(self, path, step: int | None = None):
        self.path = pathlib.Path(path)
        if step is not None and not self.saves_steps:
            raise AuditError(f"step={step} (--step) picks a saved checkpoint of a train.py run; "
                             f"{path} ({self.kind}) holds one set of weights")
        self.requested_step = step

    # -- the model
    @property
    def name(self) -> str:
        return self.path.resolve().name

    @property
    def family(self) -> str:
        """The model family the scorecard's variation panel reads routing summaries by."""
        return self.model.cfg.family

    @property
    def label(self) -> str:
        """``family/variant``: the checkpoint's model in tables."""
        return f"{self.family}/{self.model.cfg.variant}"

    @property
    def apply_fn(self):
        """``apply(params, inputs, coeffs=None) -> (logits, coeffs)``: the function audited."""
        return self.model.apply

    @property
    def schema(self):
        return self.model.schema

    @property
    def logical_axes(self):
        return self.model.logical_axes

    @property
    def has_coefficients(self) -> bool:
        return bool(jax.tree.leaves(self.schema, is_leaf=is_axes))

    @property
    def params(self):
        return self._loaded["params"]

    @functools.cached_property
    def _loaded(self) -> dict:
        return self._load()

    def _load(self) -> dict:
        """``{"params": ..., "info": {...}}`` (info: what results.json records of it)."""
        raise NotImplementedError

    @functools.cached_property
    def info(self) -> dict:
        """The checkpoint's entry in results.json: name, where, params sha256 and count, ..."""
        params = self.params
        return {"name": self.name, "run_dir": str(self.path.resolve()), **self._loaded["info"],
                "params_sha256": params_sha256(params),
                "n_params": int(sum(np.size(x) for x in jax.tree.leaves(params))),
                **self._loaded.get("extra", {})}

    def text(self):
        """How text becomes this checkpoint's tokens and tokens printed text
        (:mod:`dynjax.decoding.text`)."""
        raise AuditError(f"{self.path} ({self.kind}) has no text to decode")

    @property
    def notes(self) -> list[str]:
        """Warnings the audit prints about this checkpoint (e.g. training unfinished)."""
        return []

    @property
    def engine_key(self):
        """Targets with equal keys share one compiled audit engine."""
        return (self.kind, str(self.path.resolve()))

    def audit_target(self) -> dict:
        """The dict :func:`dynjax.audit.run.audit_targets` audits."""
        return {"apply_fn": self.apply_fn, "schema": self.schema, "params": self.params,
                "logical_axes": self.logical_axes, "info": self.info,
                "engine_key": self.engine_key, "facts": self.condition_facts,
                # a model may group its coefficient families and say what a family's table
                # must note (DeepSeek-V4: mHC's three sites one family; hash routing)
                "families": getattr(self.model, "site_families", {}),
                "site_notes": getattr(self.model, "site_notes", {})}

    @property
    def condition_facts(self) -> dict:
        """What conditions need to know of the model (weights_flat: its ``top_k``)."""
        return {}

    def require_coefficients(self):
        if not self.has_coefficients:
            raise AuditError(
                f"{self.path} holds a {self.model.cfg.variant!r} {self.family} model, which "
                "records no coefficients: there is nothing to audit. Audit a variant with "
                "coefficients (uniform, layer_static, feature_gate; mod, moe, mode_*; dgate, "
                "structured) or MUDDPythia")

    # -- the audit
    def same_run_facts(self) -> dict:
        """``{what: value}`` that the checkpoints of one audit must share."""
        return {}

    @classmethod
    def title(cls, targets) -> str:
        n = len(targets)
        return f"FCA: {targets[0].label}, {n} checkpoint" + ("s" if n > 1 else "")

    @classmethod
    def audit_meta(cls, targets, plan) -> dict:
        """What results.json's meta records about the checkpoints (before config and data)."""
        return {"plan": plan}

    def plan(self, config, settings) -> dict | None:
        """A memory and time estimate of the audit, from the config alone; None: none."""
        return None

    def format_plan(self, plan: dict) -> str:
        """The plan as the audit prints it."""
        return audit_plan.format_plan(plan, self.label, self.kind)

    def windows(self, data_cfg, n_calib: int, n_eval: int):
        """``(calibration, evaluation, info)`` windows for the audit (see
        :mod:`dynjax.audit.targets.windows`)."""
        raise NotImplementedError

    # -- the scorecard
    def scorecard_audit_config(self, config):
        """The audit settings the scorecard runs on this checkpoint."""
        return config.audit

    def execution_windows(self, config) -> int:
        """How many evaluation windows the scorecard's execution panel times on."""
        return int(config.execution_windows)

    def card_extra(self) -> dict:
        return {}

    def execution(self, params, windows, config, coeffs=None) -> dict:
        """The execution panel (:mod:`dynjax.measure.execution`) against ``baseline``;
        ``coeffs``: the forward's coefficients on ``windows`` where the caller has them."""
        raise NotImplementedError
