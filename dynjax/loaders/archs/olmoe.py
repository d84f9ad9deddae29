"""OLMoE (OlmoeForCausalLM): q/k RMSNorm over all heads, optional q/k/v clip, every layer
a softmax top-k MoE."""
from dynjax.loaders.archs import Arch, common as c


def config(hf):
    base = c.common(hf)
    bias = bool(hf["attention_bias"])
    clip = hf.get("clip_qkv")
    return dict(base, qkv_bias=bias, o_bias=bias, qk_norm="full",
                clip_qkv=None if clip is None else float(clip),
                **c.softmax_moe(hf, tuple(range(base["n_layers"])), base["intermediate_size"],
                                norm_topk_prob=bool(hf["norm_topk_prob"])))


ARCH = Arch("olmoe", config, {**c.DENSE, **c.moe_names()}, defaults=dict(
    rms_norm_eps=1e-5, rope_theta=10000.0, attention_bias=False, clip_qkv=None,
    norm_topk_prob=False))
