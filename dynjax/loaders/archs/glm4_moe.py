"""GLM-4.5 / 4.6 / 4.7, GLM-4.5-Air (Glm4MoeForCausalLM): GQA with q/k/v biases
(``attention_bias``), per-head q/k RMSNorm when ``use_qk_norm``, partial rotary (the first
``partial_rotary_factor`` of each head, 0.5 unless given), heads x head_dim wider than
the hidden size; DeepSeek-V3's sigmoid ``grouped_topk`` router with the selection-only
bias (groups as config.json says), shared experts, first dense layers."""
from dynjax.loaders.archs import Arch, common as c
from dynjax.loaders.archs.deepseek_v3 import MOE, routed


def config(hf):
    base = c.common(hf)
    return dict(base, qkv_bias=bool(hf["attention_bias"]),
                qk_norm="head" if hf["use_qk_norm"] else "none", **routed(
                    hf, base["n_layers"], router_score="sigmoid", router_bias=True,
                    n_group=int(hf.get("n_group") or 1),
                    topk_group=int(hf.get("topk_group") or 1), router_group_score="top2_sum"))


ARCH = Arch("glm4_moe", config, {**c.DENSE, **MOE}, defaults=dict(
    rms_norm_eps=1e-5, rope_theta=10000.0, attention_bias=False, use_qk_norm=False,
    partial_rotary_factor=0.5, n_group=1, topk_group=1, norm_topk_prob=True,
    routed_scaling_factor=1.0, n_shared_experts=1, first_k_dense_replace=1))
