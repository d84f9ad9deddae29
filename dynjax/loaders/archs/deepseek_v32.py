"""DeepSeek-V3.2 (DeepseekV32ForCausalLM): DeepSeek-V3's stack (MLA, the sigmoid
``grouped_topk`` router with its selection-only bias, shared experts) plus DeepSeek Sparse
Attention: in every layer a lightning indexer (``components.indexer``) scores the earlier
tokens and each query attends to its top ``index_topk`` only."""
from dynjax.loaders.archs import Arch, common as c
from dynjax.loaders.archs import deepseek_v3

X = deepseek_v3.A + "indexer."
INDEXER = {("attn", "indexer", "q_b"): (X + "wq_b.weight", 1),
           ("attn", "indexer", "k"): (X + "wk.weight", 1),
           ("attn", "indexer", "k_norm"): (X + "k_norm.weight", c.AS_IS),
           ("attn", "indexer", "k_norm_bias"): (X + "k_norm.bias", c.AS_IS),
           ("attn", "indexer", "weights"): (X + "weights_proj.weight", 1)}


def indexer(hf) -> dict:
    return dict(index_topk=int(c.get(hf, "index_topk", required=True)),
                index_n_heads=int(c.get(hf, "index_n_heads", required=True)),
                index_head_dim=int(c.get(hf, "index_head_dim", required=True)))


def config(hf):
    if not hf.get("q_lora_rank"):
        c.fail("deepseek_v32 without q_lora_rank: the indexer reads the low-rank query")
    return dict(deepseek_v3.config(hf), **indexer(hf))


ARCH = Arch("deepseek_v32", config, {**deepseek_v3.TENSORS, **INDEXER}, defaults=dict(
    deepseek_v3.ARCH.defaults, index_topk=2048, index_n_heads=64, index_head_dim=128))
