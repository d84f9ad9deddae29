"""Mistral (MistralForCausalLM): Llama's layers without biases; sliding window refused."""
from dynjax.loaders.archs import Arch, common as c


def config(hf):
    c.no_sliding(hf, None)
    return c.common(hf)


ARCH = Arch("mistral", config, c.DENSE, defaults=dict(
    rms_norm_eps=1e-6, rope_theta=10000.0, sliding_window=4096))
