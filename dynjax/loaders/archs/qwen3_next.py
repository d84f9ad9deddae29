"""Qwen3-Next (Qwen3NextForCausalLM): Gated DeltaNet and gated attention layers.

``layer_types`` (or every ``full_attention_interval``-th layer) picks each layer's token
mixer: "linear_attention" is a Gated DeltaNet (``components.deltanet``; its fused
``in_proj_qkvz`` / ``in_proj_ba`` split per key head), "full_attention" GQA with per-head
q/k norms, partial rotary (``partial_rotary_factor``, 0.25 by default) and an output gate
sigmoid(x W_gate) whose W_gate is the second half of each head's rows in the double-width
``q_proj``. Every RMSNorm but DeltaNet's gated one has gain 1 + w. The FFN follows
Qwen2-MoE's layer rule: softmax top-k experts (renormalised when ``norm_topk_prob``) and a
shared expert behind a sigmoid gate.
"""
from dynjax.loaders.archs import Arch, common as c
from dynjax.loaders.archs.qwen2_moe import sparse_layers
from dynjax.models.components import deltanet

MIXERS = {"linear_attention": "deltanet", "full_attention": "attention"}


def mixers(hf) -> tuple:
    """Each layer's token mixer from ``layer_types`` (or ``full_attention_interval``)."""
    n = int(c.get(hf, "num_hidden_layers", required=True))
    kinds = hf.get("layer_types") or [
        "full_attention" if (i + 1) % int(hf.get("full_attention_interval", 4)) == 0
        else "linear_attention" for i in range(n)]
    unknown = sorted(set(kinds) - set(MIXERS))
    if unknown or len(kinds) != n:
        c.fail(f"config.json layer_types={kinds} must give one of {sorted(MIXERS)} for each "
               f"of the {n} layers")
    return tuple(MIXERS[k] for k in kinds)


def hybrid(hf, moe_layers, norm_topk_prob: bool) -> dict:
    """The fields Qwen3-Next and Qwen3.5 share (the text model's config.json ``hf``)."""
    base = c.common(dict(hf, intermediate_size=hf.get("intermediate_size") or 0))
    bias = bool(hf["attention_bias"])
    return dict(base, qkv_bias=bias, o_bias=bias, qk_norm="head", mixers=mixers(hf),
                norm_offset=1.0, attn_output_gate=True,
                deltanet_key_heads=int(hf["linear_num_key_heads"]),
                deltanet_value_heads=int(hf["linear_num_value_heads"]),
                deltanet_key_dim=int(hf["linear_key_head_dim"]),
                deltanet_value_dim=int(hf["linear_value_head_dim"]),
                deltanet_conv_kernel=int(hf["linear_conv_kernel_dim"]),
                shared_expert_size=int(c.get(hf, "shared_expert_intermediate_size", 0)),
                **c.softmax_moe(hf, moe_layers, int(c.get(hf, "moe_intermediate_size",
                                                          required=True)), norm_topk_prob))


def config(hf):
    n = int(c.get(hf, "num_hidden_layers", required=True))
    return hybrid(hf, sparse_layers(hf, n), bool(hf["norm_topk_prob"]))


def query_and_gate(t, cfg, path, shape):
    """q_proj holds, per head, the query's head_dim rows then the gate's."""
    D, H, hd = shape
    name = c.L.format(i=path[1]) + "self_attn.q_proj.weight"
    w = t.get(name, (H * 2 * hd, D)).reshape(H, 2, hd, D)
    return w[:, 0 if path[-1] == "q" else 1].transpose(2, 0, 1)


def deltanet_tensors(layout):
    """Table entries for every Gated DeltaNet param, read through ``layout``
    (``deltanet.qwen3_next_tensor`` or ``deltanet.qwen3_5_tensor``)."""
    def read(t, cfg, path, shape):
        prefix = c.L.format(i=path[1]) + "linear_attn."
        return layout(cfg.deltanet, lambda name: t.get(prefix + name, _shape(cfg, name)),
                      path[-1])
    return {("deltanet", name): read for name in deltanet.NAMES}


def _shape(cfg, name):
    """The checkpoint's shape of a Gated DeltaNet tensor (both layouts)."""
    d = cfg.deltanet
    qk, v = d.key_heads * d.key_dim, d.value_heads * d.value_dim
    return {"in_proj_qkvz.weight": (2 * qk + 2 * v, d.hidden_size),
            "in_proj_ba.weight": (2 * d.value_heads, d.hidden_size),
            "in_proj_qkv.weight": (2 * qk + v, d.hidden_size),
            "in_proj_z.weight": (v, d.hidden_size),
            "in_proj_b.weight": (d.value_heads, d.hidden_size),
            "in_proj_a.weight": (d.value_heads, d.hidden_size),
            "conv1d.weight": (2 * qk + v, 1, d.conv_kernel),
            "dt_bias": (d.value_heads,), "A_log": (d.value_heads,), "norm.weight": (d.value_dim,),
            "out_proj.weight": (d.hidden_size, v)}[name]


TENSORS = {**c.DENSE, **c.moe_names(), **c.shared_names("mlp.shared_expert"),
           ("moe", "shared_gate"): (c.L + "mlp.shared_expert_gate.weight", 1),
           ("attn", "q"): query_and_gate, ("attn", "gate"): query_and_gate}

ARCH = Arch("qwen3_next", config, {**TENSORS, **deltanet_tensors(deltanet.qwen3_next_tensor)},
            defaults=dict(rms_norm_eps=1e-6, rope_theta=10000.0, partial_rotary_factor=0.25,
                          attention_bias=False, head_dim=256, norm_topk_prob=True,
                          decoder_sparse_step=1, linear_conv_kernel_dim=4,
                          linear_key_head_dim=128, linear_value_head_dim=128,
                          linear_num_key_heads=16, linear_num_value_heads=32,
                          shared_expert_intermediate_size=512, intermediate_size=5632))
