"""Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3's attention, Qwen2-MoE's layer rule, no shared
expert."""
from dynjax.loaders.archs import Arch, common as c
from dynjax.loaders.archs.qwen2_moe import qwen_moe


def config(hf):
    bias = bool(hf["attention_bias"])
    return qwen_moe(hf, qkv_bias=bias, o_bias=bias, qk_norm="head")


ARCH = Arch("qwen3_moe", config, {**c.DENSE, **c.moe_names()}, defaults=dict(
    rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=False, norm_topk_prob=False,
    use_sliding_window=False, decoder_sparse_step=1))
