"""Qwen3 (Qwen3ForCausalLM): GQA with per-head q/k RMSNorm; head_dim 128 unless given."""
from dynjax.loaders.archs import Arch, common as c


def config(hf):
    c.no_sliding(hf)
    bias = bool(hf["attention_bias"])
    return dict(c.common(hf), qkv_bias=bias, o_bias=bias, qk_norm="head")


ARCH = Arch("qwen3", config, c.DENSE, defaults=dict(
    rms_norm_eps=1e-6, rope_theta=10000.0, head_dim=128, attention_bias=False,
    use_sliding_window=False))
