"""Qwen2 / Qwen2.5 (Qwen2ForCausalLM): GQA with q/k/v biases (none on the output)."""
from dynjax.loaders.archs import Arch, common as c


def config(hf):
    c.no_sliding(hf)
    return dict(c.common(hf), qkv_bias=True)


ARCH = Arch("qwen2", config, c.DENSE, defaults=dict(
    rms_norm_eps=1e-6, rope_theta=10000.0, use_sliding_window=False))
