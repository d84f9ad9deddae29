"""Hugging Face checkpoint directories (config.json + safetensors) -> a dynjax ``llm`` model.

    model, params = hf.load(DIR)          # config.json's torch_dtype; dtype=jnp.float32 overrides
    logits, coeffs = model.apply(params, input_ids)    # record; coeffs=coeffs replays

``model`` is any family's (the ``llm`` family, or a plug-in's own ``port``), so the audit,
the sharding presets and the plan take it; no torch: tensors stream one at a time. Each
``model_type`` is one module of :mod:`dynjax.loaders.archs`; what a port does not compute
as transformers does fails in one line. Depth: docs/hf.md#the-loader-dynjaxloadershfpy
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np

from dynjax import runtime
from dynjax.data import text as text_data
from dynjax.errors import CheckpointError, ConfigError
from dynjax.loaders import archs, hub, tensors
from dynjax.loaders.archs import common
from dynjax.loaders.tensors import Tensors  # noqa: F401  (hf.Tensors: the reading path)
from dynjax.models import build, llm

__all__ = ["NOT_YET", "SUPPORTED", "Tensors", "config_from_hf", "load", "model_of",
           "params_from_tensors", "port", "read_config", "token_windows", "tokenizer"]
SUPPORTED = archs.SUPPORTED
NOT_YET = {  # model_type -> what this port still lacks
}


class LlmPort:
    """How an architecture whose plug-in names no ``port`` becomes a model: an
    ``llm.Config`` from its config mapping, the ``llm`` family, its tensor table."""

    @staticmethod
    def config(arch, hf: Mapping[str, Any], dtype) -> llm.Config:
        tensors.check_quantization(hf)
        try:
            return llm.Config(**arch.config({**arch.defaults, **hf}),
                              dtype=jnp.dtype(dtype).name)
        except (KeyError, TypeError) as e:
            raise ConfigError(f"config.json lacks or mistypes a field {arch.model_type} needs "
                              f"({e}); use the checkpoint's own config.json") from None
        except ValueError as e:
            raise ConfigError(f"config.json describes an invalid {arch.model_type} model: "
                              f"{e}") from None

    @staticmethod
    def build(cfg: llm.Config):
        return build(cfg)

    @staticmethod
    def params(cfg: llm.Config, t: Tensors, strict: bool = True, shardings=None):
        """The params pytree of ``cfg`` from a checkpoint's tensors, each cast to its dtype
        (``llm.param_dtype``: ``cfg.dtype``; a DeepSeek router's weight and bias float32)
        (and put on its ``shardings`` leaf, a pytree like the params) as it is read."""
        table = archs.get(cfg.model_type).tensors
        def leaf(path, shape):
            dtype = jnp.dtype(llm.param_dtype(cfg, path))
            return tensors.place(common.read_param(table, cfg, t, path, shape, dtype), dtype,
                                 _leaf(shardings, path))
        params = llm.params_from_table(cfg, leaf)
        if strict:
            tensors.refuse_unused(t, cfg)
        return params


LLM = LlmPort()


def port(model_type):
    """The port (:class:`LlmPort` or the plug-in's own ``port``) of ``model_type``."""
    return archs.get(model_type).port or LLM


def config_from_hf(hf: Mapping[str, Any], dtype="float32"):
    """The model config of a config.json dict (``llm.Config``, or the plug-in port's own);
    one-line ConfigError for what is not ported."""
    kind = hf.get("model_type")
    if kind in NOT_YET:
        common.fail(f"config.json model_type={kind!r} is not ported yet (missing: "
                    f"{NOT_YET[kind]}); supported: {', '.join(SUPPORTED)}")
    return port(kind).config(archs.get(kind), hf, dtype)


def model_of(cfg):
    """The model of a config :func:`config_from_hf` returned."""
    return port(cfg.model_type).build(cfg)


# --------------------------------------------------------------------------------------------
# Tensors
# --------------------------------------------------------------------------------------------

def params_from_tensors(cfg, t: Tensors, strict: bool = True, shardings=None):
    """The params pytree of ``cfg`` from a checkpoint's tensors, by its port (each leaf cast
    to its dtype and put on its ``shardings`` leaf as it is read); ``strict``: a tensor the
    port never read is one CheckpointError."""
    return port(cfg.model_type).params(cfg, t, strict, shardings)


def _leaf(tree, path):
    if tree is None:
        return None
    for key in path:
        tree = tree[key]
    return tree


def read_config(path: str) -> dict:
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise CheckpointError(f"{path} has no config.json; point at a Hugging Face "
                              "checkpoint directory")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            return json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cfg_path} is damaged (not valid JSON: {str(e)[:60]}); "
                              "download it again") from None


def load(path: str, dtype=None, strict: bool = True, mesh=None, preset: str = "dp",
         revision: str | None = None):
    """``(model, params)`` of a local HF checkpoint directory, or of a repo id
    (``ORG/NAME[@REV]``, or ``revision=``) in the local Hugging Face cache
    (:mod:`dynjax.loaders.hub`, offline), streamed tensor by tensor.

    ``dtype``: float32 or bfloat16; None loads in the checkpoint's own ``torch_dtype``
    (:func:`dynjax.loaders.tensors.default_dtype`). ``mesh``: a ``jax.sharding.Mesh``; each
    tensor then goes straight to its devices' shards under the ``preset`` rules of
    :mod:`dynjax.parallel.sharding` (a preset name or a rules table)."""
    path = hub.resolve(path, revision)
    hf = read_config(path)
    cfg = config_from_hf(hf, tensors.resolve_dtype(hf, dtype)[0])
    model = model_of(cfg)
    shardings = None
    if mesh is not None:
        from dynjax.parallel import sharding
        if isinstance(preset, str) and preset not in sharding.PRESETS:
            raise ConfigError(f"preset={preset!r}; choose one of {sorted(sharding.PRESETS)}")
        rules = sharding.PRESETS[preset] if isinstance(preset, str) else preset
        shardings = sharding.param_shardings(model.logical_axes(), mesh, rules)
    with runtime.ordinary_pages():   # huge pages here cost 5x in kernel time (runtime.py)
        params = params_from_tensors(cfg, Tensors(path, hf), strict, shardings)
    return model, params


# --------------------------------------------------------------------------------------------
# Text in, through the checkpoint's own tokenizer
# --------------------------------------------------------------------------------------------

def tokenizer(path: str):
    """The checkpoint's ``tokenizer.json`` (a directory, a cached repo id, or the file)."""
    from tokenizers import Tokenizer

    path = hub.resolve(path)

    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.exists(file):
        raise CheckpointError(f"{file} does not exist; copy the checkpoint's tokenizer.json "
                              "beside config.json")
    return Tokenizer.from_file(file)


def _windows(ids: np.ndarray, seq_len: int, n: int, split: str) -> np.ndarray:
    if ids.size < n * seq_len:
        raise text_data.DataError(f"the {split} text gives {ids.size} tokens, fewer than "
                                  f"{n} windows of {seq_len}; ask for fewer or shorter windows "
                                  "or give a longer text")
    return ids[: n * seq_len].reshape(n, seq_len).astype(np.int32)


def token_windows(path: str, seq_len: int, n_calibration: int, n_evaluation: int,
                  source: str = "embedded", text_path: str | None = None) -> dict:
    """Calibration and evaluation windows (n, seq_len) int32 in the checkpoint's tokens.

    The text is dynjax's (``dynjax.data.text.load_splits``: the embedded corpus, or
    ``source="files"`` with ``text_path``, a user's .txt file or folder), cut per document
    into the usual train / validation / test byte ranges; calibration windows are
    consecutive windows of the tokenized validation range and evaluation windows of the
    test range, so the two never share text and the same inputs give the same windows.
    """
    tok = tokenizer(path)
    splits = text_data.load_splits(source, text_path)
    out = {}
    for name, split, n in (("calibration", "validation", n_calibration),
                           ("evaluation", "test", n_evaluation)):
        text = splits[split].tobytes().decode("utf-8", "replace")
        ids = np.asarray(tok.encode(text, add_special_tokens=False).ids, np.int64)
        out[name] = _windows(ids, seq_len, n, split)
    return out
