"""Hugging Face checkpoint directories (config.json + safetensors) -> a dynjax ``llm`` model.

    from dynjax.loaders import hf
    model, params = hf.load(DIR)          # config.json's torch_dtype; dtype=jnp.float32 overrides
    logits, coeffs = model.apply(params, input_ids)    # record; coeffs=coeffs replays
    windows = hf.token_windows(DIR, seq_len=512, n_calibration=32, n_evaluation=64)

``model`` is ``dynjax.models.build`` of the ``llm`` family (:mod:`dynjax.models.llm`), so
the audit, the sharding presets and ``python plan.py`` treat it like any family.
No torch is needed: tensors stream one at a time through :mod:`dynjax.loaders.tensors`
(block FP8 and MXFP4 dequantised, unused towers skipped, broken files one line).

Each supported ``model_type`` is one function from config.json to ``llm.Config`` (the
switches it implements, checked) and one table of tensor names. Anything this port does not
compute exactly as transformers does (a switch set otherwise, quantized weights, a missing
or misshapen tensor, an architecture not ported yet) fails with one line naming the field
and what to do.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Mapping

import jax.numpy as jnp
import numpy as np

from dynjax.data import text as text_data
from dynjax.errors import CheckpointError, ConfigError
from dynjax.loaders import hub, tensors
from dynjax.loaders.tensors import Tensors  # noqa: F401  (hf.Tensors: the reading path)
from dynjax.models import build, llm

__all__ = ["CONFIGS", "NOT_YET", "SUPPORTED", "Tensors", "config_from_hf", "is_hf_dir", "load",
           "params_from_tensors", "read_config", "token_windows", "tokenizer"]
SUPPORTED = ("llama", "qwen3", "mixtral", "olmoe", "qwen2_moe", "qwen3_moe")
NOT_YET = {  # model_type -> what this port still lacks
    "deepseek_v2": "multi-head latent attention (MLA), group-limited top-k routing, "
                   "routed_scaling_factor and the first dense layers",
    "deepseek_v3": "multi-head latent attention (MLA), sigmoid routing with "
                   "e_score_correction_bias, group-limited top-k and routed_scaling_factor",
    "gpt_oss": "attention sinks, sliding/full attention alternation, the router bias and "
               "the clamped SwiGLU",
}
_IGNORED = ("rotary_emb.inv_freq",)  # buffers some exports carry; recomputed here


def _fail(message: str):
    raise ConfigError(message)


def _get(hf: Mapping, key: str, default=None, *, required=False):
    if key not in hf or hf[key] is None:
        if required:
            _fail(f"config.json lacks {key!r}, which {hf.get('model_type')} needs; use the "
                  "checkpoint's own config.json")
        return default
    return hf[key]


def _expect(hf: Mapping, key: str, allowed, what: str):
    """config.json's ``key`` must be one of ``allowed`` (absent counts as the first)."""
    value = hf.get(key, allowed[0])
    if value not in allowed:
        _fail(f"config.json {key}={value!r} is not supported for {hf['model_type']} ({what}); "
              f"this port computes {key}={allowed[0]!r}")


def _rope(hf: Mapping) -> dict:
    """The rotary fields of llm.Config from rope_parameters (transformers 5) or the older
    rope_theta + rope_scaling."""
    rp = dict(hf.get("rope_parameters") or {})
    scaling = dict(hf.get("rope_scaling") or {})
    theta = rp.get("rope_theta", hf.get("rope_theta", 10000.0))
    rp = {**scaling, **rp}
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind not in llm.ROPE_TYPES:
        _fail(f"config.json rope_type={kind!r} is not supported; this port computes "
              f"{', '.join(llm.ROPE_TYPES)}")
    if rp.get("partial_rotary_factor", 1.0) != 1.0:
        _fail(f"config.json partial_rotary_factor={rp['partial_rotary_factor']} is not "
              "supported; this port rotates the whole head (1.0)")
    out = {"rope_theta": float(theta), "rope_type": kind}
    if kind in ("linear", "llama3"):
        out["rope_factor"] = float(rp["factor"])
    if kind == "llama3":
        out.update(rope_low_freq_factor=float(rp["low_freq_factor"]),
                   rope_high_freq_factor=float(rp["high_freq_factor"]),
                   rope_original_max_position=int(rp["original_max_position_embeddings"]))
    return out


def _common(hf: Mapping) -> dict:
    heads = int(_get(hf, "num_attention_heads", required=True))
    hidden = int(_get(hf, "hidden_size", required=True))
    _expect(hf, "hidden_act", ("silu",), "the MLP activation")
    return dict(model_type=hf["model_type"], vocab_size=int(_get(hf, "vocab_size", required=True)),
                hidden_size=hidden, n_layers=int(_get(hf, "num_hidden_layers", required=True)),
                n_heads=heads, n_kv_heads=int(_get(hf, "num_key_value_heads", heads)),
                head_dim=int(_get(hf, "head_dim", hidden // heads)),
                intermediate_size=int(_get(hf, "intermediate_size", required=True)),
                rms_norm_eps=float(_get(hf, "rms_norm_eps", 1e-6)),
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)), **_rope(hf))


def _no_sliding(hf: Mapping):
    if hf.get("use_sliding_window") or (hf["model_type"] == "mixtral" and hf.get("sliding_window")):
        _fail(f"config.json sliding_window={hf.get('sliding_window')} (use_sliding_window="
              f"{hf.get('use_sliding_window')}): sliding-window attention is not ported; set "
              "use_sliding_window=false / sliding_window=null (exact for sequences no longer "
              "than the window)")
    kinds = set(hf.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"}:
        _fail(f"config.json layer_types has {sorted(kinds)}; this port computes full_attention "
              "in every layer")


def _sparse_layers(hf: Mapping, n_layers: int) -> tuple:
    """Qwen-MoE's rule: layer i is MoE unless in mlp_only_layers, every decoder_sparse_step."""
    step = int(hf.get("decoder_sparse_step", 1))
    skip = set(hf.get("mlp_only_layers") or ())
    return tuple(i for i in range(n_layers)
                 if i not in skip and _num_experts(hf) > 0 and (i + 1) % step == 0)


def _num_experts(hf: Mapping) -> int:
    """``num_experts`` (the Hub's configs) or ``num_local_experts`` (transformers 5's)."""
    if hf.get("num_experts") is None and hf.get("num_local_experts") is not None:
        return int(hf["num_local_experts"])
    return int(_get(hf, "num_experts", required=True))


def _llama(hf):
    _expect(hf, "mlp_bias", (False,), "biases in the MLP")
    bias = bool(hf.get("attention_bias", False))
    return dict(_common(hf), qkv_bias=bias, o_bias=bias)


def _qwen3(hf):
    _no_sliding(hf)
    bias = bool(hf.get("attention_bias", False))
    return dict(_common(hf), qkv_bias=bias, o_bias=bias, qk_norm="head")


def _mixtral(hf):
    _no_sliding(hf)
    c = _common(hf)
    return dict(c, moe_layers=tuple(range(c["n_layers"])),
                num_experts=int(_get(hf, "num_local_experts", required=True)),
                top_k=int(_get(hf, "num_experts_per_tok", required=True)),
                moe_intermediate_size=c["intermediate_size"], norm_topk_prob=True)


def _olmoe(hf):
    c = _common(hf)
    bias = bool(hf.get("attention_bias", False))
    clip = hf.get("clip_qkv")
    return dict(c, qkv_bias=bias, o_bias=bias, qk_norm="full",
                clip_qkv=None if clip is None else float(clip),
                moe_layers=tuple(range(c["n_layers"])),
                num_experts=_num_experts(hf),
                top_k=int(_get(hf, "num_experts_per_tok", required=True)),
                moe_intermediate_size=c["intermediate_size"],
                norm_topk_prob=bool(hf.get("norm_topk_prob", False)))


def _qwen_moe(hf, **attn):
    _no_sliding(hf)
    c = _common(hf)
    return dict(c, **attn, moe_layers=_sparse_layers(hf, c["n_layers"]),
                num_experts=_num_experts(hf),
                top_k=int(_get(hf, "num_experts_per_tok", required=True)),
                moe_intermediate_size=int(_get(hf, "moe_intermediate_size", required=True)),
                norm_topk_prob=bool(hf.get("norm_topk_prob", False)))


def _qwen2_moe(hf):
    shared = int(_get(hf, "shared_expert_intermediate_size", 0))
    return dict(_qwen_moe(hf, qkv_bias=bool(hf.get("qkv_bias", True))), shared_expert_size=shared)


def _qwen3_moe(hf):
    bias = bool(hf.get("attention_bias", False))
    return _qwen_moe(hf, qkv_bias=bias, o_bias=bias, qk_norm="head")


CONFIGS: dict[str, Callable[[Mapping], dict]] = {
    "llama": _llama, "qwen3": _qwen3, "mixtral": _mixtral, "olmoe": _olmoe,
    "qwen2_moe": _qwen2_moe, "qwen3_moe": _qwen3_moe}


def config_from_hf(hf: Mapping[str, Any], dtype="float32") -> llm.Config:
    """llm.Config of a config.json dict; one-line ConfigError for what is not ported."""
    kind = hf.get("model_type")
    if kind in NOT_YET:
        _fail(f"config.json model_type={kind!r} is not ported yet (missing: {NOT_YET[kind]}); "
              f"supported: {', '.join(SUPPORTED)}")
    if kind not in CONFIGS:
        _fail(f"config.json model_type={kind!r} is not supported; supported: "
              f"{', '.join(SUPPORTED)}")
    tensors.check_quantization(hf)
    try:
        return llm.Config(**CONFIGS[kind](hf), dtype=jnp.dtype(dtype).name)
    except (KeyError, TypeError) as e:
        raise ConfigError(f"config.json lacks or mistypes a field {kind} needs ({e}); use the "
                          "checkpoint's own config.json") from None
    except ValueError as e:
        raise ConfigError(f"config.json describes an invalid {kind} model: {e}") from None


# --------------------------------------------------------------------------------------------
# Tensors
# --------------------------------------------------------------------------------------------

def _moe_prefix(cfg: llm.Config) -> str:
    return "block_sparse_moe" if cfg.model_type == "mixtral" else "mlp"


_EXPERT_NAMES = {"mixtral": {"gate": "w1", "up": "w3", "down": "w2"}}
_MLP_NAMES = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}


def _read(cfg: llm.Config, t: Tensors, path: tuple, shape: tuple) -> np.ndarray:
    """The array at params ``path`` (shape ``shape``) in dynjax's layout."""
    D, H, KV, hd = cfg.hidden_size, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    linear = lambda name, n_out, n_in: t.get(name, (n_out, n_in)).T
    if path == ("embed",):
        return t.get("model.embed_tokens.weight", shape)
    if path == ("lm_head",):
        return linear("lm_head.weight", cfg.vocab_size, D)
    if path == ("final_norm",):
        return t.get("model.norm.weight", shape)
    i, part = path[1], path[2:]
    L = f"model.layers.{i}."
    if part == ("input_norm",):
        return t.get(L + "input_layernorm.weight", shape)
    if part == ("post_norm",):
        return t.get(L + "post_attention_layernorm.weight", shape)
    if part[0] == "attn":
        A, name = L + "self_attn.", part[1]
        heads = {"q": H, "k": KV, "v": KV}
        if name in heads:
            return linear(f"{A}{name}_proj.weight", heads[name] * hd, D).reshape(shape)
        if name in ("q_bias", "k_bias", "v_bias"):
            return t.get(f"{A}{name[0]}_proj.bias", (heads[name[0]] * hd,)).reshape(shape)
        if name == "o":
            return linear(A + "o_proj.weight", D, H * hd).reshape(shape)
        if name == "o_bias":
            return t.get(A + "o_proj.bias", shape)
        return t.get(f"{A}{name}.weight", (int(np.prod(shape)),)).reshape(shape)  # q/k norm
    if part[0] == "mlp":
        return linear(f"{L}mlp.{_MLP_NAMES[part[1]]}.weight", shape[1], shape[0])
    M = L + _moe_prefix(cfg) + "."
    if part[1] == "router":
        return linear(M + "gate.weight", cfg.num_experts, D)
    if part[1] == "shared_gate":
        return linear(M + "shared_expert_gate.weight", 1, D)
    if part[1] == "shared":
        return linear(f"{M}shared_expert.{_MLP_NAMES[part[2]]}.weight", shape[1], shape[0])
    names = _EXPERT_NAMES.get(cfg.model_type, _MLP_NAMES)   # part[1] == "experts"
    E, n_in, n_out = shape
    return np.stack([linear(f"{M}experts.{e}.{names[part[2]]}.weight", n_out, n_in)
                     for e in range(E)])


def params_from_tensors(cfg: llm.Config, t: Tensors, strict: bool = True, shardings=None):
    """The params pytree of ``cfg`` from a checkpoint's tensors, each cast to ``cfg.dtype``
    (and put on its ``shardings`` leaf, a pytree like the params) as it is read."""
    dt = jnp.dtype(cfg.dtype)
    params = llm.params_from_table(
        cfg, lambda path, shape: tensors.place(_read(cfg, t, path, shape), dt,
                                               _leaf(shardings, path)))
    if strict:
        extra = sorted(k for k in t.where if k not in t.used and not k.endswith(_IGNORED)
                       and not (cfg.tie_word_embeddings and k == "lm_head.weight"))
        if extra:
            raise CheckpointError(f"checkpoint has {len(extra)} tensor(s) this {cfg.model_type} "
                                  f"port does not use, e.g. {extra[0]!r}; config.json may "
                                  "describe another model (or pass strict=False)")
    return params


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
    model = build(cfg)
    shardings = None
    if mesh is not None:
        from dynjax.parallel import sharding
        if isinstance(preset, str) and preset not in sharding.PRESETS:
            raise ConfigError(f"preset={preset!r}; choose one of {sorted(sharding.PRESETS)}")
        rules = sharding.PRESETS[preset] if isinstance(preset, str) else preset
        shardings = sharding.param_shardings(model.logical_axes(), mesh, rules)
    return model, params_from_tensors(cfg, Tensors(path, hf), strict, shardings)


def is_hf_dir(path) -> bool:
    """A config.json whose model_type this loader knows (supported or not yet ported)."""
    try:
        kind = read_config(path).get("model_type")
    except (CheckpointError, OSError, json.JSONDecodeError):
        return False
    return kind in CONFIGS or kind in NOT_YET


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
