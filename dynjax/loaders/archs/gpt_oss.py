"""gpt-oss (GptOssForCausalLM): GQA with q/k/v/o biases and attention sinks, a sliding
window on the layers ``layer_types`` names "sliding_attention", YaRN rotary; every layer an
MoE whose router adds a bias and softmaxes its top-k logits, over clamped-SwiGLU experts
with biases and interleaved gate/up columns (stored stacked, as the checkpoint's
``gate_up_proj``; MXFP4 ``*_blocks`` / ``*_scales`` are dequantised by the reader)."""
from dynjax.loaders.archs import Arch, common as c

KINDS = ("sliding_attention", "full_attention")
YARN = dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
            original_max_position_embeddings=4096)   # transformers' default rope_parameters


def config(hf):
    if not hf.get("rope_parameters") and not hf.get("rope_scaling"):
        hf = dict(hf, rope_parameters=dict(YARN, rope_theta=hf["rope_theta"]))
    base = c.common(hf)
    n = base["n_layers"]
    types = list(hf.get("layer_types") or
                 [KINDS[(i + 1) % 2 == 0] for i in range(n)])   # transformers' alternation
    if len(types) != n or set(types) - set(KINDS):
        c.fail(f"config.json layer_types={types} must name one of {KINDS} for each of the "
               f"{n} layers; use the checkpoint's own config.json")
    bias = bool(hf["attention_bias"])
    return dict(base, attention="gqa_sinks", qkv_bias=bias, o_bias=bias,
                sliding_window=int(hf.get("sliding_window") or 0),
                sliding_layers=tuple(i for i, t in enumerate(types) if t == KINDS[0]),
                moe_layers=tuple(range(n)), num_experts=c.num_experts(hf),
                top_k=int(c.get(hf, "num_experts_per_tok", required=True)),
                moe_intermediate_size=base["intermediate_size"], router="topk_softmax",
                experts="clamped_swiglu", swiglu_limit=float(hf["swiglu_limit"]),
                swiglu_alpha=float(hf["swiglu_alpha"]))


M = c.L + "mlp."
ARCH = Arch("gpt_oss", config, {
    **c.DENSE,
    ("attn", "sinks"): (c.L + "self_attn.sinks", c.AS_IS),
    ("moe", "router"): (M + "router.weight", 1),
    ("moe", "router_bias"): (M + "router.bias", c.AS_IS),
    **{("moe", "experts", ours): (M + "experts." + theirs, c.AS_IS)
       for ours, theirs in (("gate_up", "gate_up_proj"), ("gate_up_bias", "gate_up_proj_bias"),
                            ("down", "down_proj"), ("down_bias", "down_proj_bias"))}},
    defaults=dict(rms_norm_eps=1e-5, rope_theta=150000.0, head_dim=64, num_key_value_heads=8,
                  num_local_experts=128, num_experts_per_tok=4, sliding_window=128,
                  attention_bias=True, swiglu_limit=7.0, swiglu_alpha=1.702,
                  tie_word_embeddings=False, hidden_act="silu"))
