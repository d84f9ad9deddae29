"""Run directories written by train.py: a language-model run (:class:`LmRun`) and a
classifier run (:class:`ClassifierRun`, DynamicGate-MLP and its baselines), opened through
:mod:`dynjax.runs.rundir` (never the trainer)."""
from __future__ import annotations

import functools
import json
import pathlib

from dynjax.decoding.text import ByteText
from dynjax.runs import rundir
from dynjax.models import FAMILIES, gate_schedule
from dynjax.measure.execution import classifier_execution_panel, execution_panel
from dynjax.audit.targets import windows
from dynjax.audit.targets.base import Target
from dynjax.errors import AuditError
from dynjax.tasks import CLASSIFY


def read_run_config(path):
    """A run directory's config.json; an AuditError naming the fix if there is none."""
    if not pathlib.Path(path).is_dir():
        from dynjax import configs
        from dynjax.loaders import hub

        cached = f" or a repo id in the Hugging Face cache {hub.cache_dir()}" \
            if hub.is_repo_id(path) else ""
        raise AuditError(f"run directory {path} does not exist; train one first, e.g. "
                         f"`{configs.command('train', 'tiny:feature_gate')} "
                         f"--workdir={path}`, or pass an existing run directory{cached}")
    return rundir.read_config(path)


class _TrainRun(Target):
    """What both kinds of train.py run share: config.json, orbax params at the latest saved
    step (or ``step``), eval.json."""

    saves_steps = True

    def __init__(self, path, config=None, step: int | None = None):
        """``config``: the audit's (nothing in it applies to a run); the run's own is
        ``self.config``."""
        super().__init__(path, step)
        self.config = read_run_config(path)
        self.model = self._model()

    def _model(self):
        return rundir.model_of(self.config)

    @property
    def family(self) -> str:
        return rundir.family_variant(self.config)[0]

    @property
    def label(self) -> str:
        return "/".join(rundir.family_variant(self.config))

    def _splits(self):
        return None

    def _load(self) -> dict:
        run = rundir.load(self.path, self.requested_step, splits=self._splits())
        family, variant = rundir.family_variant(self.config)
        extra = self._extra(run.step)
        train_eval = rundir.read_eval(self.path)   # a damaged one: one line naming it
        if train_eval is not None:
            extra["train_eval"] = train_eval
        return {"params": run.params, "step": int(run.step), "extra": extra,
                "info": {"step": int(run.step), "seed": int(self.config.seed),
                         "family": family, "variant": variant}}

    def _extra(self, step) -> dict:
        return {}

    @property
    def step(self) -> int:
        return self._loaded["step"]

    @property
    def notes(self) -> list[str]:
        if (self.path / rundir.EVAL).exists() or self.requested_step is not None:
            return []
        return [f"{self.path} has no eval.json (training unfinished?): auditing its latest "
                f"checkpoint, step {self.step}"]

    @property
    def engine_key(self):
        return json.dumps(self.config.model.to_dict(), sort_keys=True)

    def same_run_facts(self) -> dict:
        c = self.config
        return {"data.seq_len": c.data.get("seq_len"),
                "model family and variant": rundir.family_variant(c),
                "training data": [c.data.get(k) for k in ("source", "path", "tfds_name",
                                                          "dataset")]}

    @classmethod
    def audit_meta(cls, targets, plan) -> dict:
        return {"run_configs": [t.config.to_dict() for t in targets]}


class LmRun(_TrainRun):
    """A train.py language-model run: token windows of the text it trained on."""

    kind = "lm_run"

    def text(self):
        return ByteText()

    @property
    def condition_facts(self) -> dict:
        cfg = self.model.cfg
        routing = FAMILIES[cfg.family].routing(cfg)   # an llm run as its HF directory says
        return {"top_k": int(routing.top_k)} if routing and routing.token_choice else {}

    def windows(self, data_cfg, n_calib: int, n_eval: int):
        seq_len = windows.resolve_seq_len(windows.opt(data_cfg, "seq_len"),
                                          int(self.config.data.seq_len), f"checkpoint {self.path}")
        return windows.text_run_windows(data_cfg, self.config, seq_len, n_calib, n_eval)

    def execution(self, params, ev, config, coeffs=None) -> dict:
        return execution_panel(self.model.cfg, params, ev, tuple(config.latency_batches),
                               int(config.latency_repeats))


class ClassifierRun(_TrainRun):
    """A train.py classifier run: one window is one labelled example; the gates run at the
    schedule of the checkpoint's step (tau, theta, gates forced open in warm-up), i.e. the
    function the run's own evaluation measured."""

    kind = "classifier_run"
    task = CLASSIFY
    baseline = "the dense MLP"

    def _splits(self):
        return windows.run_splits(self.config)

    def _model(self):
        return rundir.model_of(self.config, self._splits())

    def _extra(self, step) -> dict:
        return {"gate_schedule": gate_schedule.apply_settings(self.config, step)}

    @property
    def gate_settings(self) -> dict:
        return self._loaded["extra"]["gate_schedule"]

    @property
    def apply_fn(self):
        return functools.partial(self.model.apply, **self.gate_settings)

    @property
    def engine_key(self):
        return json.dumps([self.config.model.to_dict(), self.gate_settings], sort_keys=True)

    def windows(self, data_cfg, n_calib: int, n_eval: int):
        if windows.opt(data_cfg, "seq_len") is not None:
            raise AuditError("data.seq_len does not apply to a classifier run (a window is "
                             "one example); drop the override")
        return windows.example_windows(data_cfg, self.config, n_calib, n_eval)

    def scorecard_audit_config(self, config):
        """``config.audit`` with ``config.classifier_examples`` calibration and evaluation
        examples, all in one forward (a window is one example: 32 would give wide
        intervals), and no window length."""
        c = config.audit.copy_and_resolve_references()
        n = int(config.classifier_examples)
        c.data.calib_windows = c.data.eval_windows = c.batch_size = n
        c.data.seq_len = None   # a MUDDPythia's window length, when one is scored beside it
        c.per_window = False
        return c

    def execution_windows(self, config) -> int:
        return int(config.classifier_examples)

    def card_extra(self) -> dict:
        return {"gate_settings": self.gate_settings}

    def execution(self, params, ev, config, coeffs=None) -> dict:
        return classifier_execution_panel(
            self.model, params, ev["x"], self.gate_settings, tuple(config.latency_batches),
            int(config.classifier_latency_repeats))
