"""A dense Hugging Face Llama / Qwen3 (or an ``llm`` run) continued as MoE, MoD, or as itself.

    python train.py --config=configs/llm_convert.py:moe --workdir=runs/llama_moe \\
        --config.train.init_from=path/to/Llama-3.2-1B             # sparse upcycling
    python train.py --config=configs/llm_convert.py:mod --workdir=runs/llama_mod \\
        --config.train.init_from=path/to/Llama-3.2-1B             # Mixture-of-Depths

The architecture is the source's config.json; ``moe``: 8 copies of each MLP, top-2; ``mod``:
layers 1, 3, 5, ... MoD (c = 0.125); ``dense``: itself; byte data (the step-0 loss jump says what it costs).
Depth: docs/conversion.md#the-config-dynjaxconfigsllm_convertpy
"""
import ml_collections

from dynjax.configs import common
from dynjax.models import llm

VARIANTS = ("moe", "mod", "dense")
FIELD_TYPES = {"model_type": str, "rope_type": str, "qk_norm": str, "rms_norm_eps": float,
               "rope_theta": float, "rope_factor": float, "rope_low_freq_factor": float,
               "rope_high_freq_factor": float, "clip_qkv": float, "qkv_bias": bool,
               "o_bias": bool, "tie_word_embeddings": bool, "attention": str,
               "partial_rotary_factor": float, "rope_interleave": bool,
               "rope_beta_fast": float, "rope_beta_slow": float, "rope_mscale": float,
               "rope_mscale_all_dim": float, "rope_attention_factor": float,
               "rope_truncate": bool}


def _from_source(name: str):
    """An unset field (None) the source fills; typed, so the command line can set it."""
    return ml_collections.FieldReference(None, field_type=FIELD_TYPES.get(name, int))


def get_config(variant: str = "moe"):
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {list(VARIANTS)}")
    c = common.base("dense")
    model = {name: _from_source(name) for name in (*llm.ARCHITECTURE, "model_type")}
    model.update(family="llm", dtype="float32", remat=False, attn_block=128,
                 moe_dispatch="dropless", moe_layers=(), num_experts=0, top_k=0,
                 moe_intermediate_size=0, norm_topk_prob=False, moe_load_balance_loss_weight=0.0,
                 mod_layers=(), mod_capacity=0.125, mod_route="topk",
                 mod_router_weight="sigmoid", mod_bce_weight=0.01, mod_predictor_weight=0.01,
                 mod_predictor_hidden=32)
    if variant == "moe":
        model.update(moe_layers=ml_collections.FieldReference(None, field_type=tuple),
                     num_experts=8, top_k=2,
                     moe_intermediate_size=ml_collections.FieldReference(None, field_type=int),
                     norm_topk_prob=True, moe_load_balance_loss_weight=0.01)
    elif variant == "mod":
        model.update(mod_layers=ml_collections.FieldReference(None, field_type=tuple))
    c.model = ml_collections.ConfigDict(model)
    c.train.update(dict(steps=200, lr=1e-4, warmup_steps=20, init_from=""))
    return c
