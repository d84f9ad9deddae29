"""What real checkpoints need in memory under dynjax.loaders.hf: parameters, total and
active per token, and their bytes at bfloat16 and float32 (docs/hf.md's table), and for the
2026 MoE checkpoints the bytes as they ship (block FP8, MXFP4) and whether their weights fit
one 80 GB (H100) or 141 GB (H200) GPU.

    python experiments/hf_memory_table.py [--out=results/hf_memory.json]

Two sources of counts, both from config.json fields written below or in
``dynjax/loaders/hf_architectures.py`` (copied by hand; nothing is downloaded):

- the ported architectures (``hf_architectures.PUBLISHED_FIELDS``): ``config_from_hf`` (so a field
  the port would refuse fails here too) and ``llm.param_table``; with transformers
  installed, also transformers' own count, which must agree;
- the checkpoints of :data:`PUBLISHED` (ports pending or under way): transformers' model
  class for the ``model_type``, instantiated on the ``meta`` device (no memory, exact shapes).
  Counts are of the text model dynjax loads: multi-token-prediction layers and vision towers,
  which ``dynjax.loaders.tensors`` skips by name, are not in them.

Active parameters per token: all parameters, with each routed expert's counted top_k / E
(embeddings included). "fits" compares the weights alone with the memory a JAX process gets
on the lent GPUs (about 78 GiB on an H100 80 GB, 139 GiB on an H200 141 GB); activations,
the KV cache and the audit's caches come on top.
"""
from __future__ import annotations

import math
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse  # noqa: E402

from dynjax.loaders.hf_architectures import PUBLISHED_FIELDS  # noqa: E402

GIB = 2 ** 30
GPUS = {"H100 80GB": 78 * GIB, "H200 141GB": 139 * GIB}
_DSV3 = dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432,
             moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128,
             num_key_value_heads=128, n_shared_experts=1, n_routed_experts=256,
             num_experts_per_tok=8, first_k_dense_replace=3, q_lora_rank=1536,
             kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
             n_group=8, topk_group=4, tie_word_embeddings=False)
_DOCUMENTED = ("transformers 5.25's configuration defaults for the model_type, which its "
               "docstring names as this checkpoint's")
# name -> (model_type, config fields (None: transformers' defaults, which are that
# checkpoint's), how the checkpoint ships, where the fields come from)
PUBLISHED = {
    "moonshotai/Moonlight-16B-A3B": ("deepseek_v3", dict(
        vocab_size=163840, hidden_size=2048, intermediate_size=11264, moe_intermediate_size=1408,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16,
        n_shared_experts=2, n_routed_experts=64, num_experts_per_tok=6,
        first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, n_group=1, topk_group=1,
        tie_word_embeddings=False), "bf16", "its config.json, copied by hand"),
    "deepseek-ai/DeepSeek-V2-Lite": ("deepseek_v2", dict(
        vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16,
        n_shared_experts=2, n_routed_experts=64, num_experts_per_tok=6,
        first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, tie_word_embeddings=False),
        "bf16", "its config.json, copied by hand"),
    "zai-org/GLM-4.5-Air": ("glm4_moe", None, "bf16",
                            "transformers 5.25's Glm4MoeConfig defaults (46 layers, 128 "
                            "experts: GLM-4.5-Air's values; its MTP layer not counted)"),
    "openai/gpt-oss-20b": ("gpt_oss", dict(num_hidden_layers=24, num_local_experts=32),
                           "mxfp4", "transformers 5.25's GptOssConfig defaults with 20b's "
                                    "24 layers and 32 experts"),
    "openai/gpt-oss-120b": ("gpt_oss", None, "mxfp4",
                            "transformers 5.25's GptOssConfig defaults (120b's 36 layers, "
                            "128 experts)"),
    "moonshotai/Kimi-K2-Instruct": ("deepseek_v3", dict(
        _DSV3, vocab_size=163840, num_attention_heads=64, num_key_value_heads=64,
        n_routed_experts=384, first_k_dense_replace=1, n_group=1, topk_group=1),
        "fp8", "its config.json (text part), copied by hand"),
    "deepseek-ai/DeepSeek-V3": ("deepseek_v3", _DSV3, "fp8",
                                "its config.json, copied by hand (its MTP layer not counted)"),
    "deepseek-ai/DeepSeek-V3.2-Exp": ("deepseek_v32", None, "fp8", _DOCUMENTED),
    "deepseek-ai/DeepSeek-V4-Flash-Base": ("deepseek_v4", None, "fp8", _DOCUMENTED),
    "Qwen/Qwen3-Next-80B-A3B-Instruct": ("qwen3_next", None, "bf16", _DOCUMENTED),
    "Qwen/Qwen3.5-35B-A3B": ("qwen3_5_moe_text", None, "bf16",
                             _DOCUMENTED + " (text model; vision tower not counted)"),
}
_NOT_QUANTIZED = ("embed_tokens", "lm_head", "norm", "mlp.gate.", "router", "bias", "sinks",
                  "e_score_correction", "indexer.weights_proj")


def _experts(name: str) -> bool:
    return ".experts." in f".{name}" and "shared" not in name


def transformers_counts(model_type: str, fields, quant: str) -> dict:
    """Parameters of transformers' causal-LM class for ``model_type`` on the meta device,
    active ones per token, and the bytes as shipped (block FP8 with 128 x 128 float32
    scales, or MXFP4 experts at 4 bits + one e8m0 byte per 32) beside bf16."""
    import torch
    import transformers

    cfg = transformers.AutoConfig.for_model(model_type, **(fields or {}))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    k = getattr(cfg, "num_experts_per_tok", None) or getattr(cfg, "top_k_experts", None)
    E = (getattr(cfg, "n_routed_experts", None) or getattr(cfg, "num_local_experts", None)
         or getattr(cfg, "num_experts", None))
    total = routed = shipped = 0
    # the tensors a checkpoint ships: parameters (tied ones once) and persistent buffers
    # (DeepSeek's e_score_correction_bias and V4's tid2eid table are buffers in transformers,
    # tensors in the checkpoint and in dynjax's parameter tree)
    saved = model.state_dict().keys()
    tensors = [*model.named_parameters(),
               *((name, b) for name, b in model.named_buffers() if name in saved)]
    for name, p in tensors:
        n = p.numel()
        total += n
        routed += n if _experts(name) else 0
        quantized = p.ndim >= 2 and not any(s in name for s in _NOT_QUANTIZED)
        if quant == "fp8" and quantized:
            *lead, rows, cols = p.shape
            shipped += n + 4 * math.prod(lead) * -(-rows // 128) * -(-cols // 128)
        elif quant == "mxfp4" and quantized and _experts(name):
            shipped += n // 2 + n // 32
        else:
            shipped += 2 * n
    active = total - routed + (routed * k // E if routed else 0)
    return {"params": total, "active_params": active, "routed_expert_params": routed,
            "layers": cfg.num_hidden_layers, "experts": E, "top_k": k,
            "transformers_class": type(model).__name__, "shipped_bytes": shipped}


def _fits(nbytes: int) -> dict:
    """Per GPU: whether the bytes fit one, and how many such GPUs hold them (weights split
    evenly over a mesh, as the fsdp / ep presets split them)."""
    return {gpu: {"one": nbytes <= cap, "gpus": -(-nbytes // cap)} for gpu, cap in GPUS.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "results/hf_memory.json"))
    args = ap.parse_args()
    from dynjax import jsonio
    from dynjax.loaders import hf
    from dynjax import models

    try:
        import transformers
    except ImportError:
        transformers = None
    rows = {}
    for name, fields in PUBLISHED_FIELDS.items():
        cfg = hf.config_from_hf(fields)
        n = models.FAMILIES[models.family_of(cfg)].module.param_count(cfg)
        rows[name] = {"model_type": cfg.model_type, "params": n["total"],
                      "active_params": n["active"], "bf16_GiB": n["total"] * 2 / GIB,
                      "f32_GiB": n["total"] * 4 / GIB, "source": "dynjax llm.param_table",
                      "bf16_fits": _fits(n["total"] * 2)}
        if transformers is not None:
            theirs = transformers_counts(fields["model_type"], {
                k: v for k, v in fields.items() if k != "model_type"}, "bf16")
            rows[name]["transformers_params"] = theirs["params"]
            assert theirs["params"] == n["total"], (name, theirs["params"], n["total"])
        print(f"{name:36s} {n['total'] / 1e9:7.2f}B params, {n['active'] / 1e9:6.2f}B active,"
              f" {rows[name]['bf16_GiB']:7.1f} GiB bf16", flush=True)
    if transformers is None:
        print("transformers is not installed: the PUBLISHED rows need it (pip install "
              "-e '.[hf]')", file=sys.stderr)
    else:
        for name, (model_type, fields, quant, source) in PUBLISHED.items():
            c = transformers_counts(model_type, fields, quant)
            row = {"model_type": model_type, **c, "bf16_GiB": c["params"] * 2 / GIB,
                   "f32_GiB": c["params"] * 4 / GIB, "ships_as": quant,
                   "shipped_GiB": c.pop("shipped_bytes") * 1.0 / GIB, "source": source,
                   "bf16_fits": _fits(c["params"] * 2)}
            row["shipped_fits"] = _fits(int(row["shipped_GiB"] * GIB))
            row.pop("shipped_bytes", None)
            rows[name] = row
            print(f"{name:36s} {c['params'] / 1e9:7.2f}B params, "
                  f"{c['active_params'] / 1e9:6.2f}B active, {row['bf16_GiB']:7.1f} GiB bf16, "
                  f"{row['shipped_GiB']:7.1f} GiB as shipped ({quant})", flush=True)
    jsonio.write_json_atomic(args.out, {
        **jsonio.stamp(),
        "transformers": getattr(transformers, "__version__", None),
        "gpu_memory_GiB": {k: v / GIB for k, v in GPUS.items()}, "models": rows})


if __name__ == "__main__":
    main()
