"""Mixtral (MixtralForCausalLM): every layer a softmax top-k MoE (always renormalised) of
SwiGLU experts named w1 / w3 / w2 under ``block_sparse_moe``."""
from dynjax.loaders.archs import Arch, common as c


def config(hf):
    c.no_sliding(hf, None)
    base = c.common(hf)
    return dict(base, **c.softmax_moe(hf, tuple(range(base["n_layers"])),
                                      base["intermediate_size"], norm_topk_prob=True))


ARCH = Arch("mixtral", config,
            {**c.DENSE, **c.moe_names("block_sparse_moe", experts=("w1", "w3", "w2"))},
            defaults=dict(rms_norm_eps=1e-5, rope_theta=1e6, sliding_window=None))
