"""What the architecture modules share: reading config.json fields, the rotary fields, the
Llama-style tensor names, and :func:`read_param`, which reads one param through a table.

A tensor table maps a params path to ``(name, n_in)``: ``name`` the checkpoint tensor
(``{i}``: the layer, ``{e}``: the expert, whose tensors are stacked), ``n_in`` how to read
it: ``AS_IS`` (the param's own shape), ``FLAT`` (a vector reshaped to the param), or the
number of leading param axes that are a linear layer's inputs (the checkpoint stores
(out, in); dynjax (in.., out..)). A callable ``(t, cfg, path, shape) -> array`` reads
anything else.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from dynjax.errors import ConfigError
from dynjax.models.components import rotary

AS_IS, FLAT = 0, -1


def fail(message: str):
    raise ConfigError(message)


def get(hf: Mapping, key: str, default=None, *, required=False):
    if key not in hf or hf[key] is None:
        if required:
            fail(f"config.json lacks {key!r}, which {hf.get('model_type')} needs; use the "
                 "checkpoint's own config.json")
        return default
    return hf[key]


def expect(hf: Mapping, key: str, allowed, what: str):
    """config.json's ``key`` must be one of ``allowed`` (absent counts as the first)."""
    value = hf.get(key, allowed[0])
    if value not in allowed:
        fail(f"config.json {key}={value!r} is not supported for {hf['model_type']} ({what}); "
             f"this port computes {key}={allowed[0]!r}")


def rope(hf: Mapping) -> dict:
    """The rotary fields of llm.Config from rope_parameters (transformers 5) or the older
    rope_theta + rope_scaling (+ partial_rotary_factor at the top level)."""
    rp = dict(hf.get("rope_parameters") or {})
    scaling = dict(hf.get("rope_scaling") or {})
    theta = rp.get("rope_theta", hf.get("rope_theta", 10000.0))
    rp = {**scaling, **rp}
    kind = rp.get("rope_type", rp.get("type", "default"))
    if kind not in rotary.ROPE_TYPES:
        fail(f"config.json rope_type={kind!r} is not supported; this port computes "
             f"{', '.join(rotary.ROPE_TYPES)}")
    partial = rp.get("partial_rotary_factor", hf.get("partial_rotary_factor")) or 1.0
    out = {"rope_theta": float(theta), "rope_type": kind,
           "partial_rotary_factor": float(partial)}
    if kind in ("linear", "llama3", "yarn"):
        out["rope_factor"] = float(rp["factor"])
    if kind == "llama3":
        out.update(rope_low_freq_factor=float(rp["low_freq_factor"]),
                   rope_high_freq_factor=float(rp["high_freq_factor"]),
                   rope_original_max_position=int(rp["original_max_position_embeddings"]))
    if kind == "yarn":
        out.update(rope_original_max_position=int(rp["original_max_position_embeddings"]),
                   rope_beta_fast=float(rp.get("beta_fast") or 32.0),
                   rope_beta_slow=float(rp.get("beta_slow") or 1.0),
                   rope_mscale=float(rp.get("mscale") or 0.0),
                   rope_mscale_all_dim=float(rp.get("mscale_all_dim") or 0.0),
                   rope_attention_factor=float(rp.get("attention_factor") or 0.0),
                   rope_truncate=bool(rp.get("truncate", True)))
    return out


def common(hf: Mapping) -> dict:
    """The fields every decoder shares (vocabulary, widths, depth, heads, norm, rotary)."""
    heads = int(get(hf, "num_attention_heads", required=True))
    hidden = int(get(hf, "hidden_size", required=True))
    expect(hf, "hidden_act", ("silu",), "the MLP activation")
    return dict(model_type=hf["model_type"], vocab_size=int(get(hf, "vocab_size", required=True)),
                hidden_size=hidden, n_layers=int(get(hf, "num_hidden_layers", required=True)),
                n_heads=heads, n_kv_heads=int(get(hf, "num_key_value_heads", heads)),
                head_dim=int(get(hf, "head_dim", hidden // heads)),
                intermediate_size=int(get(hf, "intermediate_size", required=True)),
                rms_norm_eps=float(get(hf, "rms_norm_eps", required=True)),
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)), **rope(hf))


def no_sliding(hf: Mapping, sliding_key: str = "use_sliding_window"):
    """Refuse sliding-window attention (not ported): ``use_sliding_window`` (Qwen) or, with
    ``sliding_key=None``, a set ``sliding_window`` (Mistral, Mixtral)."""
    on = hf.get("sliding_window") if sliding_key is None else hf.get(sliding_key)
    if on:
        fail(f"config.json sliding_window={hf.get('sliding_window')} (use_sliding_window="
             f"{hf.get('use_sliding_window')}): sliding-window attention is not ported; set "
             "use_sliding_window=false / sliding_window=null (exact for sequences no longer "
             "than the window)")
    kinds = set(hf.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"}:
        fail(f"config.json layer_types has {sorted(kinds)}; this port computes full_attention "
             "in every layer")


def num_experts(hf: Mapping) -> int:
    """``num_experts`` (the Hub's configs) or ``num_local_experts`` (transformers 5's)."""
    if hf.get("num_experts") is None and hf.get("num_local_experts") is not None:
        return int(hf["num_local_experts"])
    return int(get(hf, "num_experts", required=True))


def softmax_moe(hf: Mapping, moe_layers: tuple, width: int, norm_topk_prob: bool) -> dict:
    """The MoE fields of a softmax top-k router over ``num_experts`` SwiGLU experts."""
    return dict(moe_layers=moe_layers, num_experts=num_experts(hf),
                top_k=int(get(hf, "num_experts_per_tok", required=True)),
                moe_intermediate_size=width, norm_topk_prob=norm_topk_prob,
                router="softmax_topk", experts="swiglu")


# --------------------------------------------------------------------------------------------
# Tensor names
# --------------------------------------------------------------------------------------------

L = "model.layers.{i}."
DENSE = {   # Llama's names, which most ports share
    ("embed",): ("model.embed_tokens.weight", AS_IS),
    ("lm_head",): ("lm_head.weight", 1),
    ("final_norm",): ("model.norm.weight", AS_IS),
    ("input_norm",): (L + "input_layernorm.weight", AS_IS),
    ("post_norm",): (L + "post_attention_layernorm.weight", AS_IS),
    **{("attn", n): (L + f"self_attn.{n}_proj.weight", 1) for n in "qkv"},
    **{("attn", n + "_bias"): (L + f"self_attn.{n}_proj.bias", FLAT) for n in "qkv"},
    ("attn", "o"): (L + "self_attn.o_proj.weight", 2),
    ("attn", "o_bias"): (L + "self_attn.o_proj.bias", AS_IS),
    ("attn", "q_norm"): (L + "self_attn.q_norm.weight", FLAT),
    ("attn", "k_norm"): (L + "self_attn.k_norm.weight", FLAT),
    **{("mlp", n): (L + f"mlp.{n}_proj.weight", 1) for n in ("gate", "up", "down")},
}


def moe_names(prefix: str = "mlp", experts=("gate_proj", "up_proj", "down_proj"),
              router: str = "gate") -> dict:
    """The router and the per-expert SwiGLU weights under ``model.layers.{i}.<prefix>``."""
    M = L + prefix + "."
    return {("moe", "router"): (M + router + ".weight", 1),
            **{("moe", "experts", n): (M + "experts.{e}." + name + ".weight", 1)
               for n, name in zip(("gate", "up", "down"), experts)}}


def shared_names(prefix: str) -> dict:
    """An always-on SwiGLU expert at ``model.layers.{i}.<prefix>``."""
    return {("moe", "shared", n): (f"{L}{prefix}.{n}_proj.weight", 1)
            for n in ("gate", "up", "down")}


def read_param(table: Mapping, cfg, t, path: tuple, shape: tuple, dtype=None) -> np.ndarray:
    """The array at params ``path`` (shape ``shape``) in dynjax's layout, through ``table``;
    ``dtype``: the param's, which dequantised experts are cast into one at a time
    (``Tensors.stack``, MXFP4 in ``Tensors.get``)."""
    layer, key = (path[1], path[2:]) if path[0] == "layers" else (None, path)
    if key not in table:
        raise KeyError(f"{cfg.model_type}'s tensor table has no entry for {key}")
    entry = table[key]
    if callable(entry):
        return entry(t, cfg, path, shape)
    name, n_in = entry
    if "{e}" in name:   # stacked experts: one (E, stored...) array, read slot by slot
        names = [name.format(i=layer, e=e) for e in range(shape[0])]
        return _layout(lambda stored: t.stack(names, stored, dtype), n_in, shape[1:],
                       stacked=True)
    return _layout(lambda stored: t.get(name.format(i=layer), stored, dtype=dtype), n_in, shape)


def _layout(read, n_in: int, shape: tuple, stacked: bool = False) -> np.ndarray:
    """``read(stored_shape)`` in dynjax's layout ``shape`` (after a leading expert axis when
    ``stacked``): a view where it can be, so the transpose happens once, where the array is
    put on its device (:func:`dynjax.loaders.tensors.place`)."""
    lead = (-1,) if stacked else ()
    if n_in == AS_IS:
        return read(shape)
    if n_in == FLAT:
        return read((math.prod(shape),)).reshape(*lead, *shape)
    n_in_size, n_out = math.prod(shape[:n_in]), math.prod(shape[n_in:])
    return np.swapaxes(read((n_out, n_in_size)), -1, -2).reshape(*lead, *shape)
