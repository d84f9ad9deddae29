"""A Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json) of a
ported architecture (:mod:`dynjax.loaders.hf`): its routers audited on text tokenized with
its own tokenizer, its execution timed against the dense model of the same total size."""
from __future__ import annotations

import sys

from dynjax.decoding.text import TokenizerText
from dynjax.errors import AuditError
from dynjax.measure.execution import estimate, moe_execution_panel
from dynjax.models import family_of
from dynjax.audit import families
from dynjax.audit import plan as audit_plan
from dynjax.audit.targets import windows
from dynjax.audit.targets.base import Target

DEFAULT_SEQ_LEN = 256


class HfDir(Target):
    kind = "hf"
    baseline = "the dense model of the same total parameters"

    def __init__(self, path, config=None, step: int | None = None):
        from dynjax.loaders import hf, tensors

        super().__init__(path, step)
        if not self.path.is_dir():
            raise AuditError(f"HF checkpoint directory {path} does not exist; copy the "
                             "checkpoint (config.json, *.safetensors, tokenizer.json) to a local "
                             "folder first")
        section = config.get("hf") if config is not None else None
        self.flops_per_second = windows.opt(section, "flops_per_second")
        # config.json alone: the checks and the plan come before any weights load
        hf_config = hf.read_config(str(self.path))
        # hf.dtype unset: the checkpoint's own torch_dtype (bf16 stays bf16)
        self.dtype, why = tensors.resolve_dtype(hf_config, windows.opt(section, "dtype"))
        self.cfg = hf.config_from_hf(hf_config, self.dtype)
        print(f"{self.path}: weights load in {self.dtype} ({why})", file=sys.stderr)
        self.model = hf.model_of(self.cfg)

    @property
    def family(self) -> str:
        """The registry family its port builds (``llm``; ``deepseek_v4``)."""
        return family_of(self.cfg)

    @property
    def label(self) -> str:
        return f"{self.family}/{self.cfg.model_type}"

    def _load(self) -> dict:
        from dynjax.loaders import hf
        _, params = hf.load(str(self.path), self.dtype)
        return {"params": params, "info": {"family": self.family,
                                           "variant": self.cfg.model_type,
                                           "dtype": self.cfg.dtype}}

    def text(self):
        """The checkpoint's tokenizer.json, stopping at config.json's ``eos_token_id``."""
        from dynjax.loaders import hf
        return TokenizerText(hf.tokenizer(str(self.path)),
                             hf.read_config(str(self.path)).get("eos_token_id"))

    @property
    def engine_key(self):
        return ("hf", self.cfg)

    @property
    def condition_facts(self) -> dict:
        return {"top_k": int(self.cfg.top_k)} if self.cfg.moe_layers else {}

    def require_coefficients(self, what: str = "audit"):
        if not self.has_coefficients:
            raise AuditError(f"{self.path} is a dense {self.cfg.model_type} checkpoint: it has "
                             f"no router, so there is nothing to {what}; {what} an MoE "
                             "checkpoint (e.g. mixtral, olmoe, qwen3_moe, deepseek_v3, gpt_oss)")

    def scorecard_audit_config(self, config):
        """Refused before any work for a dense checkpoint (the scorecard's panels are its
        routers' variation, dependence and execution)."""
        self.require_coefficients("score")
        return super().scorecard_audit_config(config)

    @classmethod
    def title(cls, targets) -> str:
        return f"FCA: {targets[0].cfg.model_type} ({targets[0].name}), 1 checkpoint"

    def plan(self, config, settings) -> dict:
        dc = config.data
        n_calib, n_eval = int(dc.calib_windows), int(dc.eval_windows)
        seq_len = int(windows.opt(dc, "seq_len", DEFAULT_SEQ_LEN))
        rows = min(settings.batch_size, n_calib, n_eval)
        est = estimate(self.model, n_eval, seq_len, rows)
        model = {"n_layer": self.cfg.n_layers, "dim": self.cfg.hidden_size,
                 "dtype": self.cfg.dtype, "params": est["param_count"],
                 "active_params": est["active_param_count"]}
        sites = config.get("sites")
        chosen = {} if sites is None else families.select(families.of_schema(self.schema),
                                                          sites)
        return audit_plan.audit_plan(model, est, n_calib, n_eval, seq_len, settings,
                                     self.flops_per_second,
                                     tables=1 + len(chosen) if len(chosen) > 1 else 1)

    def format_plan(self, plan: dict) -> str:
        return audit_plan.format_plan(plan, f"HF {self.cfg.model_type}", "hf")

    def windows(self, data_cfg, n_calib: int, n_eval: int):
        """Consecutive windows of the validation (calibration) and test (evaluation) text,
        tokenized with the checkpoint's tokenizer.json (:func:`dynjax.loaders.hf.
        token_windows`): the embedded corpus, or ``data.source=files`` with ``data.path``."""
        from dynjax.loaders import hf

        seq_len = int(windows.opt(data_cfg, "seq_len", DEFAULT_SEQ_LEN))
        source = windows.opt(data_cfg, "source", "embedded")
        path = windows.opt(data_cfg, "path")
        w = hf.token_windows(str(self.path), seq_len, n_calib, n_eval, source=source,
                             text_path=path)
        info = {"source": source, "path": path, "tokenizer": "tokenizer.json",
                "calibration_split": "validation", "evaluation_split": "test", "notes": []}
        return w["calibration"], w["evaluation"], info

    def execution(self, params, ev, config, coeffs=None) -> dict:
        return moe_execution_panel(self.cfg, params, ev, tuple(config.latency_batches),
                                   int(config.latency_repeats), coeffs)
