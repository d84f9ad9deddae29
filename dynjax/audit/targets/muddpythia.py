"""A MUDDPythia HF directory (config.json, *.safetensors, tokenizer.json): the paper's
external control, audited on local text tokenized with its own tokenizer."""
from __future__ import annotations

import functools
import json

import numpy as np

from dynjax.measure.execution import muddpythia_execution_panel
from dynjax.audit import plan as audit_plan
from dynjax.audit.targets import windows
from dynjax.audit.targets.base import Target
from dynjax.errors import AuditError

DEFAULT_SEQ_LEN = 512


class MuddPythiaDir(Target):
    kind = "muddpythia"
    baseline = "static mixing"

    def __init__(self, path, config=None, step: int | None = None):
        super().__init__(path, step)
        if not self.path.is_dir():
            raise AuditError(f"MUDDPythia directory {path} does not exist; download the "
                             "checkpoint (config.json, *.safetensors, tokenizer.json) to a local "
                             "folder first")
        section = config.get("muddpythia") if config is not None else None
        self.dtype = windows.opt(section, "dtype", "float32")

    @functools.cached_property
    def _hf(self):
        from dynjax.loaders import muddpythia_hf
        return muddpythia_hf.load_hf_dir(str(self.path), dtype=self.dtype)

    @property
    def cfg(self):
        return self._hf[0]

    @functools.cached_property
    def model(self):
        from dynjax.models import build
        return build(self.cfg)

    family = "muddpythia"
    label = "muddpythia/muddpythia"
    has_coefficients = True   # its mixing weights; known before the weights load

    def _load(self) -> dict:
        return {"params": self._hf[1], "info": {"family": "muddpythia",
                                                "variant": "muddpythia", "dtype": self.cfg.dtype}}

    @property
    def engine_key(self):
        return ("muddpythia", self.cfg)

    @classmethod
    def title(cls, targets) -> str:
        return f"FCA: MUDDPythia ({targets[0].name}), 1 checkpoint"

    def plan(self, config, settings) -> dict:
        """Memory and time of the audit from config.json alone (no weights); {} without one."""
        from dynjax.loaders import muddpythia_hf
        from dynjax.models import muddpythia

        cfg_path = self.path / "config.json"
        if not cfg_path.exists():
            return {}
        cfg = muddpythia_hf.config_from_hf(json.loads(cfg_path.read_text()), dtype=self.dtype)
        dc = config.data
        n_calib, n_eval = int(dc.calib_windows), int(dc.eval_windows)
        seq_len = int(windows.opt(dc, "seq_len", DEFAULT_SEQ_LEN))
        rows = min(settings.batch_size, n_calib, n_eval)
        est = muddpythia.memory_time_estimate(cfg, n_eval, seq_len, rows)
        model = {"n_layer": cfg.n_layer, "dim": cfg.dim, "dtype": cfg.dtype,
                 "params": est["param_count"]}
        return audit_plan.audit_plan(model, est, n_calib, n_eval, seq_len, settings,
                                     windows.opt(config.muddpythia, "flops_per_second"))

    @staticmethod
    def format_plan(plan: dict) -> str:
        return audit_plan.format_plan(plan, "MUDDPythia", "muddpythia")

    def windows(self, data_cfg, n_calib: int, n_eval: int):
        """Token windows of local text (:func:`dynjax.audit.targets.windows.local_text`), tokenized
        with the checkpoint's tokenizer.json; without one, bytes are the tokens (only for
        byte-vocabulary models)."""
        seq_len = int(windows.opt(data_cfg, "seq_len", DEFAULT_SEQ_LEN))
        cfg, _, tokenizer = self._hf
        if seq_len > cfg.block_size:
            raise AuditError(f"data.seq_len={seq_len} exceeds the model's block_size "
                             f"{cfg.block_size}; set --config.data.seq_len={cfg.block_size} or "
                             "less")
        texts, src = windows.local_text(data_cfg, "MUDDPythia")

        def encode(t):
            if tokenizer is not None:
                return np.asarray(tokenizer.encode(t).ids, np.int32)
            if cfg.vocab_size < 256:
                raise AuditError(f"the checkpoint directory has no tokenizer.json and its "
                                 f"vocabulary ({cfg.vocab_size}) is not bytes; copy the model's "
                                 "tokenizer.json into it (pip install tokenizers)")
            return np.frombuffer(t.encode("utf-8"), np.uint8).astype(np.int32)

        calib, ev, notes = windows.tokenized_windows(texts, encode, seq_len, n_calib, n_eval)
        src.update(tokenizer="tokenizer.json" if tokenizer is not None else "bytes", notes=notes)
        return calib, ev, src

    def execution(self, params, ev, config, coeffs=None) -> dict:
        return muddpythia_execution_panel(self.cfg, params, ev,
                                          tuple(config.latency_batches),
                                          int(config.latency_repeats))
