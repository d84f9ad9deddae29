"""Qwen1.5-MoE / Qwen2-MoE (Qwen2MoeForCausalLM): q/k/v biases; softmax top-k MoE layers
(``decoder_sparse_step``, ``mlp_only_layers``) with a shared expert behind a sigmoid gate."""
from dynjax.loaders.archs import Arch, common as c


def sparse_layers(hf, n_layers: int) -> tuple:
    """Qwen-MoE's rule: layer i is MoE unless in mlp_only_layers, every decoder_sparse_step."""
    step = int(hf.get("decoder_sparse_step", 1))
    skip = set(hf.get("mlp_only_layers") or ())
    return tuple(i for i in range(n_layers)
                 if i not in skip and c.num_experts(hf) > 0 and (i + 1) % step == 0)


def qwen_moe(hf, **attention):
    c.no_sliding(hf)
    base = c.common(hf)
    return dict(base, **attention, **c.softmax_moe(
        hf, sparse_layers(hf, base["n_layers"]),
        int(c.get(hf, "moe_intermediate_size", required=True)), bool(hf["norm_topk_prob"])))


def config(hf):
    return dict(qwen_moe(hf, qkv_bias=bool(hf["qkv_bias"])),
                shared_expert_size=int(c.get(hf, "shared_expert_intermediate_size", 0)))


ARCH = Arch("qwen2_moe", config, {
    **c.DENSE, **c.moe_names(), **c.shared_names("mlp.shared_expert"),
    ("moe", "shared_gate"): (c.L + "mlp.shared_expert_gate.weight", 1)},
    defaults=dict(rms_norm_eps=1e-6, rope_theta=10000.0, qkv_bias=True, norm_topk_prob=False,
                  use_sliding_window=False, decoder_sparse_step=1,
                  shared_expert_intermediate_size=5632))
