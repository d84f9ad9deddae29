"""An ``llm``-family train.py run as a Hugging Face checkpoint directory.

    python -m dynjax.export RUN_DIR OUT_DIR [--step N]       # or: dynjax-export RUN_DIR OUT_DIR

OUT_DIR gets config.json, model.safetensors (the port's own tensor table read backwards),
the byte-level tokenizer files and generation_config.json, written atomically; a config
that does not load back as the run's architecture is refused in one line. What each file
holds and what is refused: docs/conversion.md (Export).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import shutil
import sys
import tempfile

import numpy as np

from dynjax.errors import CheckpointError, ConfigError
from dynjax.loaders import archs
from dynjax.loaders.archs import common

PROG = "python -m dynjax.export"
WEIGHTS = "model.safetensors"
# llm.Config fields that say how the forward is computed on this machine, not what it
# computes (dispatch form, attention blocks, rematerialisation, dtype) or how it trains
RUNTIME = ("dtype", "moe_dispatch", "attn_block", "remat", "moe_load_balance_loss_weight",
           "router_bias_rate",
           "mod_capacity", "mod_route", "mod_router_weight", "mod_bce_weight",
           "mod_predictor_weight", "mod_predictor_hidden")
# where a run with no HF twin of its own model_type may go (first that computes it wins)
MOE_TYPES = ("mixtral", "qwen3_moe", "olmoe", "qwen2_moe")
DENSE_TYPES = ("llama", "qwen3", "qwen2", "mistral")
ALWAYS = ("model_type", "architectures", "dtype", "max_position_embeddings",
          "hidden_act", "bos_token_id", "eos_token_id", "pad_token_id")


def architectures(model_type: str) -> list:
    """transformers' class name for ``model_type`` (``qwen2_moe`` -> ``Qwen2MoeForCausalLM``):
    what vLLM and pipelines read."""
    return ["".join(p[:1].upper() + p[1:] for p in model_type.split("_")) + "ForCausalLM"]


def _rope(cfg) -> dict:
    rp = {"rope_type": cfg.rope_type, "rope_theta": float(cfg.rope_theta)}
    if cfg.partial_rotary_factor != 1.0:
        rp["partial_rotary_factor"] = float(cfg.partial_rotary_factor)
    if cfg.rope_type in ("linear", "llama3", "yarn"):
        rp["factor"] = float(cfg.rope_factor)
    if cfg.rope_type == "llama3":
        rp.update(low_freq_factor=float(cfg.rope_low_freq_factor),
                  high_freq_factor=float(cfg.rope_high_freq_factor),
                  original_max_position_embeddings=int(cfg.rope_original_max_position))
    if cfg.rope_type == "yarn":
        rp.update(original_max_position_embeddings=int(cfg.rope_original_max_position),
                  beta_fast=cfg.rope_beta_fast, beta_slow=cfg.rope_beta_slow,
                  mscale=cfg.rope_mscale, mscale_all_dim=cfg.rope_mscale_all_dim,
                  attention_factor=cfg.rope_attention_factor or None,
                  truncate=cfg.rope_truncate)
    return rp


def _candidate(cfg, model_type: str, max_positions: int) -> dict:
    """Every config.json field any port reads, set from ``cfg`` (pruned by :func:`hf_config`)."""
    moe = bool(cfg.moe_layers)
    dt = str(cfg.dtype)
    out = dict(
        model_type=model_type, architectures=architectures(model_type), dtype=dt,
        max_position_embeddings=int(max_positions), hidden_act="silu",
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size, rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_word_embeddings, rope_parameters=_rope(cfg),
        rope_theta=float(cfg.rope_theta), attention_bias=cfg.qkv_bias, qkv_bias=cfg.qkv_bias,
        mlp_bias=False, clip_qkv=cfg.clip_qkv, sliding_window=None, use_sliding_window=False)
    if moe:
        out.update(num_experts=cfg.num_experts, num_local_experts=cfg.num_experts,
                   num_experts_per_tok=cfg.top_k, norm_topk_prob=cfg.norm_topk_prob,
                   moe_intermediate_size=cfg.moe_intermediate_size, decoder_sparse_step=1,
                   mlp_only_layers=[i for i in range(cfg.n_layers) if i not in cfg.moe_layers],
                   shared_expert_intermediate_size=cfg.shared_expert_size)
        if _all_moe(cfg) and model_type in ("mixtral", "olmoe"):
            out["intermediate_size"] = cfg.moe_intermediate_size   # their experts' width
    return out


def _all_moe(cfg) -> bool:
    return set(cfg.moe_layers) == set(range(cfg.n_layers))


def _computes(cfg, hf: dict) -> bool:
    """Whether the port of ``hf["model_type"]`` reads ``hf`` as ``cfg``'s architecture."""
    from dynjax.loaders import hf as hf_loader
    try:
        got = hf_loader.config_from_hf(hf, cfg.dtype)
    except (ConfigError, ValueError, KeyError, TypeError):
        return False
    unused = ("intermediate_size",) if _all_moe(cfg) else ()   # no dense layer reads it
    same = {f: getattr(cfg, f) for f in (*RUNTIME, "model_type", *unused)}
    return dataclasses.replace(got, **same) == cfg


def hf_config(cfg, max_positions: int) -> dict:
    """The config.json of ``cfg`` (an ``llm.Config``): its own model_type when the port of
    that type computes it, else the first of the MoE / dense types that does; ConfigError
    when none does."""
    from dynjax.models import llm
    if not isinstance(cfg, llm.Config):
        raise ConfigError(f"export writes llm-family runs; a {type(cfg).__module__} model "
                          "has no exporter yet (its checkpoint directory is already the HF "
                          "one it was loaded from)")
    if cfg.mod_layers:
        raise ConfigError(f"the run has Mixture-of-Depths layers {list(cfg.mod_layers)}, "
                          "which no Hugging Face architecture computes; only runs without "
                          "mod_layers export")
    order = [cfg.model_type] + [t for t in (MOE_TYPES if cfg.moe_layers else DENSE_TYPES)
                                if t != cfg.model_type]
    for model_type in order:
        if model_type not in archs.ARCHS:
            continue
        hf = _candidate(cfg, model_type, max_positions)
        if not _computes(cfg, hf):
            continue
        for key in sorted(hf):   # leave out what the port's (transformers') default gives
            if key in ALWAYS:
                continue
            less = {k: v for k, v in hf.items() if k != key}
            if _computes(cfg, less):
                hf = less
        return dict(sorted(hf.items()))
    raise ConfigError(f"no ported Hugging Face model_type computes this run's architecture "
                      f"(model_type={cfg.model_type}, moe_layers={list(cfg.moe_layers)}, "
                      f"qk_norm={cfg.qk_norm}, norm_topk_prob={cfg.norm_topk_prob}); tried "
                      f"{', '.join(t for t in order if t in archs.ARCHS)}")


# --------------------------------------------------------------------------------------------
# Tensors: the port's table, read backwards
# --------------------------------------------------------------------------------------------

def _as_checkpoint(a: np.ndarray, n_in: int) -> np.ndarray:
    """One dynjax array in the checkpoint's layout (``common.read_param`` inverted)."""
    if n_in == common.AS_IS:
        return a
    if n_in == common.FLAT:
        return a.reshape(-1)
    n_in_size = math.prod(a.shape[:n_in])
    return a.reshape(n_in_size, -1).T


def tensors_of(cfg, params, model_type: str) -> dict:
    """``{tensor name: array}`` of ``params`` under ``model_type``'s names."""
    from dynjax.models import llm

    table = archs.get(model_type).tensors
    out = {}
    for path, shape, _ in llm.param_table(cfg):
        value = params
        for key in path:
            value = value[key]
        value = np.asarray(value)
        layer, key = (path[1], path[2:]) if path[0] == "layers" else (None, path)
        entry = table.get(key)
        if entry is None or callable(entry):
            raise ConfigError(f"{model_type}'s tensor table cannot name params {'/'.join(map(str, path))}; "
                              "this run does not export as that model_type")
        name, n_in = entry
        if "{e}" in name:
            for e in range(shape[0]):
                out[name.format(i=layer, e=e)] = _as_checkpoint(value[e], n_in)
        else:
            out[name.format(i=layer)] = _as_checkpoint(value, n_in)
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


# --------------------------------------------------------------------------------------------
# The byte-level tokenizer
# --------------------------------------------------------------------------------------------

def byte_chars() -> list:
    """GPT-2's byte -> printable character map (the ByteLevel pre-tokenizer's), by byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def byte_tokenizer():
    """A ``tokenizers.Tokenizer`` whose ids are the UTF-8 bytes (train.py's text)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE({c: b for b, c in enumerate(byte_chars())}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------

def export_params(cfg, params, out_dir, max_positions: int = 2048, extra: dict | None = None):
    """Write ``params`` of ``cfg`` (an ``llm.Config``) as the HF directory ``out_dir``
    (atomically: complete or absent). Returns its config.json dict."""
    from safetensors.numpy import save_file

    out = pathlib.Path(out_dir)
    if out.exists():
        raise ConfigError(f"{out} exists; export writes a new directory (remove it or name "
                          "another)")
    hf = hf_config(cfg, max_positions)
    names = tensors_of(cfg, params, hf["model_type"])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        save_file(names, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(hf, indent=1, sort_keys=True) + "\n")
        (tmp / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": None, "eos_token_id": None}, indent=1) + "\n")
        byte_tokenizer().save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_positions,
             "clean_up_tokenization_spaces": False}, indent=1) + "\n")
        if extra:
            (tmp / "dynjax_export.json").write_text(json.dumps(extra, indent=1,
                                                               sort_keys=True) + "\n")
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        os.chmod(tmp, 0o755)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return hf


def export_run(run_dir, out_dir, step: int | None = None) -> dict:
    """Export the train.py run ``run_dir`` (at ``step``, default the latest checkpoint)."""
    from dynjax.models import FAMILIES
    from dynjax.runs import rundir

    if not (pathlib.Path(run_dir) / rundir.CONFIG).exists():
        raise CheckpointError(f"{run_dir} is not a train.py run directory (no config.json)")
    config = rundir.read_config(run_dir)
    family = config.model.get("family")
    if not getattr(FAMILIES.get(family), "exports_hf", False):
        raise ConfigError(f"{run_dir} is a {family!r}-family run; only llm-family runs "
                          "export (their layers are Hugging Face architectures'): train with "
                          "configs/llm_convert.py or configs/routing_study.py")
    if pathlib.Path(out_dir).exists():
        raise ConfigError(f"{out_dir} exists; export writes a new directory (remove it or "
                          "name another)")
    hf_config(rundir.model_of(config).cfg, int(config.data.seq_len))   # refuse before loading
    run = rundir.load(run_dir, step)
    import jax
    params = jax.device_get(run.params)
    return export_params(run.model.cfg, params, out_dir, int(config.data.seq_len),
                         extra={"run": os.path.basename(os.path.normpath(str(run_dir))),
                                "step": int(run.step), "seed": int(config.seed),
                                "tokenizer": "bytes (UTF-8, id = byte value)"})


def main(argv=None, prog: str = PROG) -> int:
    import argparse

    from dynjax.errors import run_program

    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="an llm-family train.py run directory")
    parser.add_argument("out_dir", help="the Hugging Face directory to create (must not exist)")
    parser.add_argument("--step", type=int, default=None,
                        help="the checkpoint step (default: the latest)")
    args = parser.parse_args(argv)
    hf = run_program(prog, lambda: export_run(args.run_dir, args.out_dir, args.step))
    print(f"{args.out_dir}: {hf['model_type']} ({hf['architectures'][0]}), "
          f"{hf['num_hidden_layers']} layers, vocabulary {hf['vocab_size']}")
    return 0


if __name__ == "__main__":
    from dynjax.runtime import setup

    setup("__main__")
    sys.exit(main())
