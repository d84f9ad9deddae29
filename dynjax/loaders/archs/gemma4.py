"""Gemma-4 (Gemma4ForConditionalGeneration), the text model: 26B-A4B's MoE and the dense
ones without per-layer embeddings or shared KV layers (docs/hf.md, "Gemma-4").

``llm``'s layer form "gemma4" (sandwich norms, a dense GeGLU MLP beside the MoE, a layer
scalar), the ``normed_softmax_topk`` router over ``geglu`` experts, q/k/v-normed unscaled
attention: "sliding_attention" layers windowed, the others with ``global_layer``'s heads,
K = V and proportional rotary; embeddings times sqrt(D), soft-capped logits. The wrapper's
text model is read from under ``model.language_model.``; its towers are skipped by name.
"""
from dynjax.loaders import tensors
from dynjax.loaders.archs import Arch, common as c

KINDS = ("sliding_attention", "full_attention")
ROPE = {"sliding_attention": dict(rope_type="default", rope_theta=10000.0),
        "full_attention": dict(rope_type="proportional", partial_rotary_factor=0.25,
                               rope_theta=1000000.0)}        # transformers' defaults
TEXT_DEFAULTS = dict(vocab_size=262144, hidden_size=2304, intermediate_size=9216,
                     num_hidden_layers=30, num_attention_heads=8, num_key_value_heads=4,
                     head_dim=256, global_head_dim=512, hidden_activation="gelu_pytorch_tanh",
                     rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False,
                     sliding_window=512, hidden_size_per_layer_input=256,
                     attention_k_eq_v=False, num_kv_shared_layers=0, enable_moe_block=False)
ROPE_FIELDS = ("rope_theta", "rope_type", "rope_factor", "partial_rotary_factor")


def text_config(hf) -> dict:
    """The text model's fields (``text_config``, or the file itself for a text-only export)
    over transformers' defaults, named as the file's model_type."""
    text = hf.get("text_config") or hf
    return {**TEXT_DEFAULTS, **{k: v for k, v in text.items() if v is not None},
            "model_type": hf["model_type"]}


def layer_types(hf, n: int) -> list:
    """Each layer's attention kind: transformers' 5 sliding : 1 full, the last layer full."""
    kinds = list(hf.get("layer_types") or [KINDS[(i + 1) % 6 == 0] for i in range(n)])
    if len(kinds) != n or set(kinds) - set(KINDS):
        c.fail(f"config.json layer_types={kinds} must name one of {KINDS} for each of the "
               f"{n} layers; use the checkpoint's own config.json")
    kinds[-1] = "full_attention"    # transformers forces it
    return kinds


def rope(hf, kind: str) -> dict:
    """The rotary fields of the layers of one kind (rope_parameters is per kind)."""
    out = c.rope({"rope_parameters": (hf.get("rope_parameters") or ROPE)[kind]})
    if out["rope_type"] not in ("default", "proportional"):
        c.fail(f"config.json rope_parameters[{kind!r}] rope_type={out['rope_type']!r}: "
               "this port computes 'default' and 'proportional'")
    factor = (hf.get("rope_parameters") or ROPE)[kind].get("factor")
    return {**out, **({"rope_factor": float(factor)} if factor else {})}


def global_heads(hf, kinds) -> dict:
    """The full-attention layers' head_dim and KV heads: ``per_layer_config`` (one override
    per full layer, the same for each) or ``global_head_dim`` / ``num_global_key_value_heads``."""
    per_layer = {int(i): dict(v) for i, v in (hf.get("per_layer_config") or {}).items()}
    if not per_layer:
        kv = hf.get("num_global_key_value_heads") if hf["attention_k_eq_v"] else None
        return dict(head_dim=int(hf["global_head_dim"]), **({"n_kv_heads": int(kv)} if kv else {}))
    full = [i for i, k in enumerate(kinds) if k == KINDS[1]]
    shared = per_layer.get(full[0], {})
    if set(per_layer) != set(full) or any(per_layer[i] != shared for i in full) or \
            set(shared) - {"head_dim", "num_key_value_heads"}:
        c.fail(f"config.json per_layer_config={hf['per_layer_config']}: this port computes one "
               "head_dim / num_key_value_heads override shared by every full_attention layer")
    names = {"head_dim": "head_dim", "num_key_value_heads": "n_kv_heads"}
    return {names[k]: int(v) for k, v in shared.items()}


def config(hf):
    hf = text_config(hf)
    c.expect(hf, "hidden_activation", ("gelu_pytorch_tanh",), "the MLP activation")
    c.expect(hf, "attention_bias", (False,), "biases in the attention projections")
    c.expect(hf, "hidden_size_per_layer_input", (0,), "per-layer input embeddings (PLE)")
    c.expect(hf, "num_kv_shared_layers", (0,), "layers reusing earlier layers' keys/values")
    c.expect(hf, "use_bidirectional_attention", (None, "vision"), "causal text attention")
    n = int(hf["num_hidden_layers"])
    kinds = layer_types(hf, n)
    base = c.common(dict(hf, hidden_act="silu", rope_parameters=None, rope_scaling=None))
    local, full = rope(hf, KINDS[0]), rope(hf, KINDS[1])
    global_layer = dict(**global_heads(hf, kinds), k_eq_v=bool(hf["attention_k_eq_v"]), **full)
    moe = {}
    if hf["enable_moe_block"]:
        moe = dict(moe_layers=tuple(range(n)), num_experts=int(c.get(hf, "num_experts",
                                                                     required=True)),
                   top_k=int(c.get(hf, "top_k_experts", required=True)),
                   moe_intermediate_size=int(c.get(hf, "moe_intermediate_size", required=True)),
                   norm_topk_prob=True, router="normed_softmax_topk", experts="geglu")
    return dict(base, **local, **moe, qk_norm="head", v_norm=True, attention_scale=1.0,
                hidden_act="gelu_tanh", layer_form="gemma4", embed_scale=True,
                final_logit_softcap=float(hf.get("final_logit_softcapping") or 0.0),
                sliding_window=int(hf.get("sliding_window") or 0),
                sliding_layers=tuple(i for i, k in enumerate(kinds) if k == KINDS[0]),
                global_layer=tuple(global_layer.items()))


def stacked(name: str):
    """An expert tensor stored (expert, out, in), read as (expert, in, out)."""
    def read(t, cfg, path, shape):
        E, n_in, n_out = shape
        return t.get(c.L.format(i=path[1]) + name, (E, n_out, n_in)).transpose(0, 2, 1)
    return read


def norm_names(*pairs) -> dict:
    """params path (under the layer) -> ``model.layers.{i}.<name>.weight``."""
    return {path: (c.L + name + ".weight", c.AS_IS) for path, name in pairs}


TENSORS = {
    **c.DENSE,
    **norm_names((("attn_out_norm",), "post_attention_layernorm"),
                 (("post_norm",), "pre_feedforward_layernorm"),
                 (("ffn_out_norm",), "post_feedforward_layernorm"),
                 (("mlp_out_norm",), "post_feedforward_layernorm_1"),
                 (("moe", "in_norm"), "pre_feedforward_layernorm_2"),
                 (("moe", "out_norm"), "post_feedforward_layernorm_2")),
    ("layer_scalar",): (c.L + "layer_scalar", c.AS_IS),
    ("moe", "router"): (c.L + "router.proj.weight", 1),
    ("moe", "router_scale"): (c.L + "router.scale", c.AS_IS),
    ("moe", "expert_scale"): (c.L + "router.per_expert_scale", c.AS_IS),
    ("moe", "experts", "gate_up"): stacked("experts.gate_up_proj"),
    ("moe", "experts", "down"): stacked("experts.down_proj"),
}

tensors.PREFIXES["gemma4"] = {"model.language_model.": "model."}
ARCH = Arch("gemma4", config, TENSORS)
