"""A run's ``train.init_from``: the source, recognised by
:func:`dynjax.runs.opener.open_checkpoint` (an ``llm`` or core-family run, ``RUN:STEP``, or
a Hugging Face directory of a ported architecture); the model fields a conversion config
leaves unset, taken from it; its record in config.json (``train.init_source``), read back
on resume; and the conversion of a new run (:mod:`dynjax.train.convert` converts the
parameters). docs/conversion.md.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import ml_collections
from etils import epath

from dynjax.data import text as text_data
from dynjax.errors import ConfigError
from dynjax.loaders import hf
from dynjax.models import build, llm
from dynjax.runs import rundir
from dynjax.runs.opener import NAMES, Checkpoint, open_checkpoint
from dynjax.train import convert
from dynjax.train.evaluation import Evaluator

HF_STEP = "hf"      # the step recorded for a Hugging Face source (one set of weights)


def _source(spec, step=None) -> Checkpoint:
    """The checkpoint ``spec`` names, if it is one a conversion starts from (a language-
    model run or an HF directory); ``step``: a recorded step (``HF_STEP`` for an HF one)."""
    found = open_checkpoint(spec, step=None if step == HF_STEP else step)
    if found.kind == "classifier_run":
        raise ConfigError(f"train.init_from={spec!r} is a classifier run; conversions start "
                          "from a language-model run or a Hugging Face directory")
    if found.kind not in ("lm_run", "hf"):
        raise ConfigError(f"train.init_from={spec!r} is a {NAMES[found.kind]} directory, "
                          "which does not convert; start from a language-model run or a Hugging "
                          f"Face directory of a ported architecture ({', '.join(hf.SUPPORTED)})")
    return found


def load(found: Checkpoint) -> rundir.Run:
    """The source's parameters: a run's checkpoint (its step, or the latest), or a Hugging
    Face directory's weights, read in float32 (exact for bf16 and fp16 checkpoints; step
    ``HF_STEP``)."""
    if found.kind == "hf":
        model, params = hf.load(str(found.path), jnp.float32)
        return rundir.Run(None, model, params, HF_STEP)
    if found.step is None and not rundir.steps(found.path):
        raise ConfigError(f"train.init_from={str(found.path)!r} has no checkpoint; train it "
                          "first")
    return rundir.load(found.path, found.step)


def source_config(spec: str) -> llm.Config:
    """The llm config of a conversion's source, from its config.json alone (no weights
    read): a Hugging Face directory of a ported architecture, or an llm run."""
    found = _source(spec)
    if found.kind == "hf":
        return hf.config_from_hf(found.config)
    model = found.config.model
    if model.get("family") != "llm":
        raise ConfigError(f"train.init_from={spec!r} is a {model.get('family', 'gates')} run; "
                          "an llm model converts from a Hugging Face directory (llama, "
                          "qwen3, ...) or an llm run")
    return build(model.to_dict()).cfg


UNSET_RULES = {  # routing fields an llm conversion config may leave unset: their rule
    "moe_layers": lambda m: tuple(range(m.n_layers)),          # every layer
    "mod_layers": lambda m: tuple(range(1, m.n_layers, 2)),    # every other: 1, 3, 5, ...
    "moe_intermediate_size": lambda m: m.intermediate_size,    # experts are the MLP's copies
}
BYTE_VOCAB = 256    # train.py feeds bytes


def fill_from_source(config):
    """The llm family's ``resolve`` hook: the model fields ``config`` leaves unset (None) from
    ``train.init_from``'s config.json, so a conversion config names only what it adds.

    ``llm.ARCHITECTURE`` and ``model_type`` are copied from the source; unset routing fields
    follow ``UNSET_RULES``. A field the config sets is kept, and ``plan`` then refuses a
    source whose architecture differs. ``clip_qkv`` None is a value (no clipping): alone,
    it reads nothing (a resumed run's recorded model has it). The vocabulary must hold the
    256 byte values."""
    m = config.model
    unset = [k for k in (*llm.ARCHITECTURE, "model_type", *UNSET_RULES) if m.get(k, 0) is None]
    if [k for k in unset if k != "clip_qkv"]:   # clip_qkv None alone: no clipping
        spec = config.train.get("init_from", "")
        if not spec:
            raise ConfigError(f"model.{unset[0]} (and {len(unset) - 1} more fields) are taken "
                              "from train.init_from's config.json, and there is none: set "
                              "--config.train.init_from=HF_DIR (or an llm run) or give them")
        src = source_config(spec)
        for k in unset:
            if k not in UNSET_RULES:
                m[k] = getattr(src, k)
        for k in unset:
            if k in UNSET_RULES:
                m[k] = UNSET_RULES[k](m)
    if m.vocab_size < BYTE_VOCAB:
        raise ConfigError(f"model.vocab_size={m.vocab_size}: train.py feeds bytes (0-255), so "
                          f"an llm model needs a vocabulary of at least {BYTE_VOCAB}")
    return config


def with_recorded_model(config, run_dir):
    """A resumed conversion's unset model fields as its config.json recorded them: a resume
    never reads the source again (it may have moved or gone). Unchanged for a new run, or
    when ``train.init_from`` is not the recorded one (``source_of`` then refuses it)."""
    old = epath.Path(run_dir) / rundir.CONFIG
    model = config.model.to_dict()
    if model.get("family") != "llm" or not old.exists() or None not in model.values():
        return config
    recorded = json.loads(old.read_text())
    source = recorded.get("train", {}).get("init_source") or {}
    if source.get("spec") != config.train.get("init_from"):
        return config
    config = ml_collections.ConfigDict(config.to_dict())
    for k, v in model.items():
        if v is None and k in recorded.get("model", {}):
            config.model[k] = recorded["model"][k]
    return config


@dataclasses.dataclass
class Source:
    """A run's ``train.init_from``: its record for config.json, and the conversion."""

    record: dict
    run: rundir.Run | None = None
    report: dict | None = None

    def load(self) -> rundir.Run:
        if self.run is None:
            run = load(_source(self.record["path"], self.record["step"]))
            if rundir.params_sha256(run.params) != self.record["params_sha256"]:
                raise ConfigError(f"train.init_from: {self.record['path']} step "
                                  f"{self.record['step']} no longer holds the parameters this "
                                  "run was converted from (its digest changed); restore it or "
                                  "start a new --workdir")
            self.run = run
        return self.run

    def convert(self, task, state):
        """The fresh ``state`` with converted params (opt_state stays the fresh one)."""
        run, tc = self.load(), task.config.train
        windows = text_data.eval_windows(task.splits["train"], task.config.data.seq_len,
                                         tc.get("init_calibration_windows", 64))
        params, report = convert.convert(run.model.cfg, run.params, task.model.cfg, state["params"],
                                         windows=windows, gain=tc.get("init_router_gain", 2.0),
                                         noise=tc.get("init_upcycle_noise", 0.0),
                                         seed=task.config.seed)
        params = jax.device_put(params, task.state_shardings["params"])
        state = dict(state, params=params)
        n = tc.get("init_report_windows", 64)
        val = task.windows("validation")[:n]
        bs = task.config.eval.batch_size
        before = Evaluator(run.model.cfg)(run.params, val, bs)
        after = task.evaluator(state["params"], val, bs)
        self.report = {"step": 0, "split": "conversion", **report, "source": before,
                       "converted": after, "jump_bpb": after["bpb"] - before["bpb"]}
        return state


def source_of(task, run_dir) -> Source | None:
    """The run's source (None without ``train.init_from``), checked against the task's
    model, its record put into ``task.config.train.init_source`` for config.json. A run
    directory that already records one keeps it: the same step and digest, whatever the
    source holds now."""
    config = task.config
    spec = config.train.get("init_from", "")
    if not spec:
        return None
    if rundir.is_classifier(config):
        raise ConfigError("train.init_from is for language-model runs")
    old = pathlib.Path(run_dir) / rundir.CONFIG
    previous = json.loads(old.read_text()).get("train", {}).get("init_source") \
        if old.exists() else None
    if previous and previous.get("spec") != spec:
        raise ConfigError(f"{run_dir} was converted from train.init_from="
                          f"{previous.get('spec')!r}, not {spec!r}; resume with that value or "
                          "use a new --workdir")
    if previous:
        source = Source(dict(previous))
    else:
        found = _source(spec)
        run = load(found)
        convert.plan(run.model.cfg, run.params, task.model.cfg, task.abstract["params"])
        record = {"spec": spec, "path": str(found.path.resolve()), "step": run.step,
                  "params_sha256": rundir.params_sha256(run.params),
                  "family": run.model.cfg.family, "variant": run.model.cfg.variant}
        if run.step == HF_STEP:
            record["model_type"] = run.model.cfg.model_type
        source = Source(record, run)
    config.train.init_source = source.record
    return source
