"""Llama 1-3.x (LlamaForCausalLM): GQA, SwiGLU, default / linear / llama3 rotary."""
from dynjax.loaders.archs import Arch, common as c


def config(hf):
    c.expect(hf, "mlp_bias", (False,), "biases in the MLP")
    bias = bool(hf["attention_bias"])
    return dict(c.common(hf), qkv_bias=bias, o_bias=bias)


ARCH = Arch("llama", config, c.DENSE, defaults=dict(
    rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=False, mlp_bias=False))
