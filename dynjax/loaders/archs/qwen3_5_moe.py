"""Qwen3.5-MoE / Qwen3.6-MoE (Qwen3_5MoeForConditionalGeneration), the text model.

Qwen3-Next's layers (``archs.qwen3_next``) with Qwen3.5's separate DeltaNet projections
(``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``), every layer a softmax
top-k MoE, always renormalised, with a gated shared expert. The checkpoints ship the
multimodal wrapper: config.json's ``text_config`` describes the text model, whose tensors
sit under ``model.language_model.`` (read as ``model.``); the vision tower and the
multi-token-prediction block are skipped by name (``loaders.tensors``). Text positions are
the same on the three multimodal rotary axes, so the rotary is the plain partial one.
"""
from dynjax.loaders import tensors
from dynjax.loaders.archs import Arch, common as c
from dynjax.loaders.archs.qwen3_next import TENSORS, deltanet_tensors, hybrid
from dynjax.models.components import deltanet

TEXT_DEFAULTS = dict(rms_norm_eps=1e-6, rope_theta=10000.0, partial_rotary_factor=0.25,
                     attention_bias=False, head_dim=256, linear_conv_kernel_dim=4,
                     linear_key_head_dim=128, linear_value_head_dim=128,
                     linear_num_key_heads=16, linear_num_value_heads=32,
                     shared_expert_intermediate_size=512, tie_word_embeddings=False)


def text_config(hf) -> dict:
    """The text model's fields (``text_config``, or the file itself for a text-only
    export), named as the wrapper's model_type."""
    text = hf.get("text_config") or hf
    return {**TEXT_DEFAULTS, **text, "model_type": hf["model_type"]}


def config(hf):
    text = text_config(hf)
    n = int(c.get(text, "num_hidden_layers", required=True))
    return hybrid(text, tuple(range(n)), norm_topk_prob=True)


tensors.PREFIXES["qwen3_5_moe"] = {"model.language_model.": "model."}
ARCH = Arch("qwen3_5_moe", config, {**TENSORS, **deltanet_tensors(deltanet.qwen3_5_tensor)})
