"""DeepSeek-V3 / R1 / V3.1, Kimi-K2, Moonlight (DeepseekV3ForCausalLM): multi-head latent
attention (``mla``; interleaved rotary pairs unless ``rope_interleave`` is false, YaRN with
its mscale), the first ``first_k_dense_replace`` layers dense, the others a sigmoid
``grouped_topk`` router with the selection-only ``e_score_correction_bias`` over routed
SwiGLU experts plus ``n_shared_experts`` always-on ones."""
from dynjax.loaders.archs import Arch, common as c

A = c.L + "self_attn."
MLA = {
    ("attn", "q_a"): (A + "q_a_proj.weight", 1),
    ("attn", "q_a_norm"): (A + "q_a_layernorm.weight", c.AS_IS),
    ("attn", "q_b"): (A + "q_b_proj.weight", 1),
    ("attn", "q"): (A + "q_proj.weight", 1),
    ("attn", "kv_a"): (A + "kv_a_proj_with_mqa.weight", 1),
    ("attn", "kv_a_norm"): (A + "kv_a_layernorm.weight", c.AS_IS),
    ("attn", "kv_b"): (A + "kv_b_proj.weight", 1),
    ("attn", "o"): (A + "o_proj.weight", 2),
}
MOE = {**c.moe_names(), **c.shared_names("mlp.shared_experts"),   # GLM-4.5's too
       ("moe", "router_bias"): (c.L + "mlp.gate.e_score_correction_bias", c.AS_IS)}
TENSORS = {**c.DENSE, **MLA, **MOE}


def mla(hf) -> dict:
    """The attention fields of an MLA model (DeepSeek-V2/V3 and GLM-4.7-Flash)."""
    c.expect(hf, "attention_bias", (False,), "biases in the attention projections")
    base = c.common(hf)
    return dict(base, attention="mla", n_kv_heads=base["n_heads"],
                head_dim=int(c.get(hf, "qk_rope_head_dim", required=True)),
                q_lora_rank=int(hf.get("q_lora_rank") or 0),
                kv_lora_rank=int(c.get(hf, "kv_lora_rank", required=True)),
                qk_nope_head_dim=int(c.get(hf, "qk_nope_head_dim", required=True)),
                v_head_dim=int(c.get(hf, "v_head_dim", required=True)))


def routed(hf, n_layers: int, moe_layers=None, **router) -> dict:
    """The MoE fields: the layers from first_k_dense_replace on (or ``moe_layers``), the
    routed and shared experts; ``router`` the grouped_topk settings."""
    if moe_layers is None:
        c.expect(hf, "moe_layer_freq", (1,), "every layer after the first dense ones is MoE")
        moe_layers = tuple(range(int(hf["first_k_dense_replace"]), n_layers))
    width = int(c.get(hf, "moe_intermediate_size", required=True))
    experts = hf.get("n_routed_experts") or hf.get("num_local_experts")
    if experts is None:
        c.fail("config.json lacks 'n_routed_experts'; use the checkpoint's own config.json")
    return dict(moe_layers=moe_layers, num_experts=int(experts),
                top_k=int(c.get(hf, "num_experts_per_tok", required=True)),
                moe_intermediate_size=width, norm_topk_prob=bool(hf["norm_topk_prob"]),
                shared_expert_size=width * int(hf["n_shared_experts"]),
                shared_expert_gate=False, router="grouped_topk",
                routed_scaling_factor=float(hf["routed_scaling_factor"]), **router)


def config(hf):
    c.expect(hf, "scoring_func", ("sigmoid",), "the router's scores")
    c.expect(hf, "topk_method", ("noaux_tc",), "bias-corrected group-limited top-k")
    base = mla(hf)
    return dict(base, rope_interleave=bool(hf["rope_interleave"]), **routed(
        hf, base["n_layers"], router_score="sigmoid", router_bias=True,
        n_group=int(hf.get("n_group") or 1), topk_group=int(hf.get("topk_group") or 1),
        router_group_score="top2_sum"))


ARCH = Arch("deepseek_v3", config, TENSORS, defaults=dict(
    rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=False, rope_interleave=True,
    q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
    v_head_dim=128, n_group=8, topk_group=4, norm_topk_prob=True, routed_scaling_factor=2.5,
    n_shared_experts=1, first_k_dense_replace=3))
