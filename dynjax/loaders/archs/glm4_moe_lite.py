"""GLM-4.7-Flash (Glm4MoeLiteForCausalLM): DeepSeek-V3's multi-head latent attention and
tensor names with GLM's sigmoid router (selection-only bias, groups as config.json says);
``mlp_layer_types`` says which layers are MoE ("sparse"; by default all but the first)."""
from dynjax.loaders.archs import Arch, common as c
from dynjax.loaders.archs.deepseek_v3 import TENSORS, mla, routed


def config(hf):
    base = mla(hf)
    n = base["n_layers"]
    kinds = hf.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n - 1)
    if len(kinds) != n or set(kinds) - {"dense", "sparse"}:
        c.fail(f"config.json mlp_layer_types={kinds} must name 'dense' or 'sparse' for each of "
               f"the {n} layers")
    return dict(base, rope_interleave=bool(hf["rope_interleave"]), **routed(
        hf, n, moe_layers=tuple(i for i, k in enumerate(kinds) if k == "sparse"),
        router_score="sigmoid", router_bias=True, n_group=int(hf.get("n_group") or 1),
        topk_group=int(hf.get("topk_group") or 1), router_group_score="top2_sum"))


ARCH = Arch("glm4_moe_lite", config, TENSORS, defaults=dict(
    rms_norm_eps=1e-5, rope_theta=10000.0, attention_bias=False, rope_interleave=True,
    q_lora_rank=768, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=192,
    v_head_dim=256, n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=1.8,
    n_shared_experts=1))
