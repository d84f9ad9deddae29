"""GLM-5 (GlmMoeDsaForCausalLM): DeepSeek-V3.2's stack (MLA with interleaved rotary, the
sigmoid ``grouped_topk`` router with its selection-only bias, shared experts, the lightning
indexer) with the indexer's rotary pairs interleaved too, the MoE layers named by
``mlp_layer_types`` ("sparse"), and the indexer run only in the ``indexer_types`` "full"
layers: a "shared" layer reuses the previous full layer's top-k."""
from dynjax.loaders.archs import Arch, common as c
from dynjax.loaders.archs import deepseek_v3, deepseek_v32


def config(hf):
    if not hf.get("q_lora_rank"):
        c.fail("glm_moe_dsa without q_lora_rank: the indexer reads the low-rank query")
    base = deepseek_v3.mla(hf)
    n = base["n_layers"]
    first = int(hf.get("first_k_dense_replace", 3))
    mlp = hf.get("mlp_layer_types") or ["dense"] * min(first, n) + ["sparse"] * max(n - first, 0)
    kinds = hf.get("indexer_types") or ["full"] * n
    if len(mlp) != n or len(kinds) != n or kinds[0] != "full":
        c.fail(f"config.json mlp_layer_types / indexer_types must have {n} entries, the first "
               "indexer 'full'; use the checkpoint's own config.json")
    moe = deepseek_v3.routed(dict(hf, first_k_dense_replace=0), n, router_score="sigmoid",
                             router_bias=True, n_group=int(hf.get("n_group") or 1),
                             topk_group=int(hf.get("topk_group") or 1),
                             router_group_score="top2_sum")
    moe["moe_layers"] = tuple(i for i, t in enumerate(mlp) if t == "sparse")
    return dict(base, rope_interleave=True, **moe, **deepseek_v32.indexer(hf),
                index_shared=tuple(i for i, t in enumerate(kinds) if t == "shared"),
                index_rope_interleave=True)


ARCH = Arch("glm_moe_dsa", config, {**deepseek_v3.TENSORS, **deepseek_v32.INDEXER},
            defaults=dict(rms_norm_eps=1e-5, rope_theta=10000.0, attention_bias=False,
                          q_lora_rank=2048, kv_lora_rank=512, qk_rope_head_dim=64,
                          qk_nope_head_dim=192, v_head_dim=256, n_group=1, topk_group=1,
                          norm_topk_prob=True, routed_scaling_factor=2.5, n_shared_experts=1,
                          first_k_dense_replace=3, moe_layer_freq=1, index_topk=2048,
                          index_n_heads=32, index_head_dim=128))
