"""Qwen3.5 dense (Qwen3_5ForConditionalGeneration), the text model.

Qwen3.5-MoE's layers (``archs.qwen3_5_moe``: Gated DeltaNet and gated attention, norms with
gain 1 + w, partial rotary, the multimodal wrapper's prefixes, vision and MTP tensors skipped)
with a dense SwiGLU MLP (``intermediate_size``) in every layer: no router, so its
coefficients are the attention output gates and the DeltaNet beta and decay.
"""
from dynjax.loaders import tensors
from dynjax.loaders.archs import Arch, common as c
from dynjax.loaders.archs.qwen3_5_moe import text_config
from dynjax.loaders.archs.qwen3_next import deltanet_tensors, hybrid, query_and_gate
from dynjax.models.components import deltanet


def config(hf):
    text = text_config(hf)
    c.get(text, "intermediate_size", required=True)
    return hybrid(dict(text, num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0,
                       shared_expert_intermediate_size=0), (), norm_topk_prob=False)


tensors.PREFIXES["qwen3_5"] = {"model.language_model.": "model."}
ARCH = Arch("qwen3_5", config, {**c.DENSE, ("attn", "q"): query_and_gate,
                                ("attn", "gate"): query_and_gate,
                                **deltanet_tensors(deltanet.qwen3_5_tensor)})
