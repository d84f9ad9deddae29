"""DeepSeek-V2 / V2-Lite / V2.5 (DeepseekV2ForCausalLM): DeepSeek-V3's attention (rotary
pairs always interleaved) and layer plan; the router's softmax scores, no selection bias,
``topk_method`` "greedy" (plain top-k) or "group_limited_greedy" (a group's score is its
best expert's), weights times ``routed_scaling_factor``."""
from dynjax.loaders.archs import Arch, common as c
from dynjax.loaders.archs.deepseek_v3 import MLA, mla, routed

METHODS = ("greedy", "group_limited_greedy")


def config(hf):
    c.expect(hf, "scoring_func", ("softmax",), "the router's scores")
    c.expect(hf, "mlp_bias", (False,), "biases in the MLP")
    # transformers' DeepseekV2 router never renormalises; no published V2 sets it
    c.expect(hf, "norm_topk_prob", (False,), "transformers' DeepSeek-V2 router ignores it")
    method = hf["topk_method"]
    if method not in METHODS:
        c.fail(f"config.json topk_method={method!r} is not supported for deepseek_v2; this "
               f"port computes {', '.join(METHODS)}")
    groups = method == "group_limited_greedy"
    base = mla(hf)
    return dict(base, rope_interleave=True, **routed(
        hf, base["n_layers"], router_score="softmax", router_bias=False,
        n_group=int(c.get(hf, "n_group", required=groups)) if groups else 1,
        topk_group=int(c.get(hf, "topk_group", required=groups)) if groups else 1,
        router_group_score="max"))


ARCH = Arch("deepseek_v2", config, {**c.DENSE, **MLA, **c.moe_names(),
                                    **c.shared_names("mlp.shared_experts")}, defaults=dict(
    rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=False, mlp_bias=False,
    q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
    v_head_dim=128, topk_method="greedy", norm_topk_prob=False, routed_scaling_factor=1.0,
    n_shared_experts=2, first_k_dense_replace=0))
