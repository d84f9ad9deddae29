"""Official MUDDPythia checkpoints (PyTorch names, HF directories) <-> dynjax params.

Kept out of :mod:`dynjax.models.muddpythia` so the model file holds the model: this module
knows the official config.json fields, parameter names and file formats; the model only
its own pytree (:func:`dynjax.models.muddpythia.param_table` maps one onto the other).
"""
from __future__ import annotations

import glob
import json
import os
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from dynjax.errors import CheckpointError
from dynjax.models import muddpythia


# Architecture switches of the official config that this file implements. A config.json that
# sets any of them differently describes another model, so loading it fails loudly.
_SUPPORTED_SWITCHES = {
    "use_qk_norm": True, "use_parallel_residual": True, "use_linear_bias": True,
    "dense": True, "dynamic_dense": True, "dense_type": "qkvr", "sepln": True,
    "expand_last": True, "round64": True, "stack_hidden": False, "tie_word_embeddings": False,
}


def ffn_width_rule(intermediate_size: int, n_layer: int, i: int) -> int:
    """Official depth-growing FFN width: from 0.5x to 1.5x the base, rounded to 128."""
    return int(round(intermediate_size * (i / (n_layer - 1) + 0.5) / 128) * 128)


def da_width_rule(n_streams: int, n_sources: int, last: bool) -> int:
    """Official DA hidden width (round64): always rounds *up past* a multiple of 64."""
    return (n_streams * n_sources * (4 if last else 1) // 64 + 1) * 64


def config_from_hf(hf: Mapping[str, Any], dtype: str = "float32") -> muddpythia.Config:
    """Build from an official ``config.json`` dict (gpt-fast style field names)."""
    for key, want in _SUPPORTED_SWITCHES.items():
        if key in hf and hf[key] != want:
            raise ValueError(f"config {key}={hf[key]!r} is not supported (this "
                             f"implementation covers {key}={want!r})")
    try:
        n_layer, dim, n_head = int(hf["n_layer"]), int(hf["dim"]), int(hf["n_head"])
        vocab = int(hf["vocab_size"])
    except KeyError as e:
        raise ValueError(f"config lacks the field {e.args[0]!r}") from None
    n_local = hf.get("n_local_heads", -1)
    if n_local not in (-1, None, n_head):
        raise ValueError(f"config n_local_heads={n_local} (grouped-query attention) is "
                         "not supported")
    head_dim = dim // n_head                      # the official code overwrites head_dim
    base_ffn = hf.get("intermediate_size") or 4 * dim
    last = n_layer - 1
    return muddpythia.Config(
        n_layer=n_layer, dim=dim, n_head=n_head, head_dim=head_dim,
        rotary_dims=int(head_dim * float(hf.get("rotary_pct", 0.25))),
        vocab_size=vocab,
        ffn_widths=tuple(ffn_width_rule(base_ffn, n_layer, i) for i in range(n_layer)),
        da_widths=tuple(da_width_rule(4 if i < last else 1, i + 2, i == last)
                        for i in range(n_layer)),
        rope_base=float(hf.get("rope_base", 10000.0)),
        norm_eps=float(hf.get("norm_eps", 1e-5)),
        block_size=int(hf.get("block_size", 2048)),
        dtype=dtype)


# Non-parameter buffers a PyTorch state dict may carry; they are recomputed here.
_IGNORED_BUFFERS = ("freqs_cis", "causal_mask", "kv_cache", "inv_freq", "k_cache", "v_cache")


def _to_numpy(x) -> np.ndarray:
    """numpy / jax / torch-like tensor -> numpy, without importing torch."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach"):           # torch tensor
        x = x.detach().cpu()
        try:
            return x.numpy()
        except TypeError:              # torch bfloat16 has no numpy dtype
            return x.float().numpy()
    if hasattr(x, "numpy") and not isinstance(x, jax.Array):
        return np.asarray(x.numpy())
    return np.asarray(x)


def _infer_config(sd: Mapping[str, np.ndarray], dtype: str) -> muddpythia.Config:
    """Read the architecture off the parameter shapes (rope settings take official defaults)."""
    def shape(name):
        if name not in sd:
            raise ValueError(f"state dict lacks the parameter {name!r}")
        return sd[name].shape

    V, D = shape("tok_embeddings.weight")
    n_layer = 0
    while f"layers.{n_layer}.attention.wq.weight" in sd:
        n_layer += 1
    if n_layer == 0:
        raise ValueError("state dict lacks the parameter 'layers.0.attention.wq.weight'")
    hd = shape("layers.0.attention.q_norm.weight")[0]
    if D % hd:
        raise ValueError(f"parameter 'layers.0.attention.q_norm.weight' has size {hd}, "
                         f"which does not divide dim {D}")
    return muddpythia.Config(
        n_layer=n_layer, dim=D, n_head=D // hd, head_dim=hd, rotary_dims=int(hd * 0.25),
        vocab_size=V,
        ffn_widths=tuple(shape(f"layers.{i}.feed_forward.w1.weight")[0] for i in range(n_layer)),
        da_widths=tuple(shape(f"dynamic_dense.{i}.w1.weight")[0] for i in range(n_layer)),
        dtype=dtype)


def from_state_dict(state_dict: Mapping[str, Any], config: Optional[Mapping[str, Any]] = None,
                    dtype: Optional[str] = None, strict: bool = True):
    """Official PyTorch state dict -> (Config, params).

    ``config`` is the official config.json as a dict; without it the architecture is inferred
    from shapes and the rope settings take the official defaults (base 10000, 25% rotary).
    ``dtype`` defaults to bfloat16 if every float parameter is bfloat16, else float32.
    Missing, misshapen or (with ``strict``) unknown parameters raise ValueError naming them.
    A common prefix such as ``model.`` before ``tok_embeddings.weight`` is stripped.
    """
    sd = {str(k): v for k, v in state_dict.items()}
    if "tok_embeddings.weight" not in sd:
        prefixes = {k[: -len("tok_embeddings.weight")] for k in sd
                    if k.endswith(".tok_embeddings.weight")}
        if len(prefixes) == 1:
            p = prefixes.pop()
            sd = {k[len(p):]: v for k, v in sd.items() if k.startswith(p)}
    sd = {k: _to_numpy(v) for k, v in sd.items()}
    if dtype is None:
        kinds = {a.dtype.name for a in sd.values()
                 if a.dtype.name in ("float16", "float32", "float64", "bfloat16")}
        dtype = "bfloat16" if kinds == {"bfloat16"} else "float32"
    cfg = config_from_hf(config, dtype) if config is not None else _infer_config(sd, dtype)

    seen = set()

    def leaf(name, _, want, transpose):
        if name not in sd:
            raise ValueError(f"state dict lacks the parameter {name!r} (expected shape {want})")
        a = sd[name].T if transpose else sd[name]
        if tuple(a.shape) != want:
            raise ValueError(f"parameter {name!r} has shape {tuple(sd[name].shape)}, expected "
                             f"{want[::-1] if transpose else want}")
        seen.add(name)
        return jnp.asarray(a, dtype=cfg.dtype)
    params = muddpythia.params_from_table(cfg, leaf)
    if strict:
        unknown = sorted(k for k in sd if k not in seen
                         and not any(b in k for b in _IGNORED_BUFFERS))
        if unknown:
            raise ValueError(f"state dict has unexpected parameter(s) {unknown[:8]}"
                             + (" ..." if len(unknown) > 8 else ""))
    return cfg, params


def to_state_dict(cfg: muddpythia.Config, params) -> dict[str, np.ndarray]:
    """params -> official names and layouts (the inverse of :func:`from_state_dict`)."""
    out = {}
    for name, path, _, transpose in muddpythia.param_table(cfg):
        a = params
        for key in path:
            a = a[key]
        a = np.asarray(a)
        out[name] = np.ascontiguousarray(a.T if transpose else a)
    return out


def load_hf_dir(path: str, dtype: Optional[str] = None):
    """A local HF checkpoint directory -> (cfg, params, tokenizer or None). No torch needed.

    Reads config.json, every ``*.safetensors`` file (numpy API) and, if present,
    tokenizer.json (needs the ``tokenizers`` package).
    """
    cfg_path = os.path.join(path, "config.json")
    hf = None
    if os.path.exists(cfg_path):
        with open(cfg_path) as f:
            hf = json.load(f)
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise CheckpointError(f"no *.safetensors file in {path}; a MUDDPythia directory needs "
                              "config.json and the *.safetensors weights")
    from safetensors.numpy import load_file
    sd = {}
    for fn in files:
        sd.update(load_file(fn))
    cfg, params = from_state_dict(sd, config=hf, dtype=dtype)
    tokenizer = None
    tok_path = os.path.join(path, "tokenizer.json")
    if os.path.exists(tok_path):
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ImportError(f"{tok_path} needs the 'tokenizers' package: "
                              "pip install tokenizers") from e
        tokenizer = Tokenizer.from_file(tok_path)
    return cfg, params, tokenizer
