"""Architecture fields of published Hugging Face config.json files, copied by hand (nothing
is downloaded): the production models ``dynjax.loaders.hf`` ports, sized by the memory plan
(``configs/hf_llm.py``), ``experiments/hf_memory_table.py`` and
``experiments/audit_hf_plan.py``."""

GQA = dict(hidden_act="silu", tie_word_embeddings=False)
PUBLISHED_FIELDS = {
    "meta-llama/Llama-3.1-8B": dict(
        GQA, model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=8192)),
    "Qwen/Qwen3-8B": dict(
        GQA, model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
        num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        rope_theta=1000000.0),
    "mistralai/Mixtral-8x7B-v0.1": dict(
        GQA, model_type="mixtral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        num_local_experts=8, num_experts_per_tok=2, rope_theta=1000000.0),
    "allenai/OLMoE-1B-7B-0924": dict(
        GQA, model_type="olmoe", vocab_size=50304, hidden_size=2048, intermediate_size=1024,
        num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16, num_experts=64,
        num_experts_per_tok=8, norm_topk_prob=False),
    "Qwen/Qwen1.5-MoE-A2.7B": dict(
        GQA, model_type="qwen2_moe", vocab_size=151936, hidden_size=2048,
        intermediate_size=5632, moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16,
        num_key_value_heads=16, num_experts=60, num_experts_per_tok=4, norm_topk_prob=False),
    "Qwen/Qwen3-30B-A3B": dict(
        GQA, model_type="qwen3_moe", vocab_size=151936, hidden_size=2048,
        intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[]),
    # transformers 5.25's configuration defaults for these model_types, which its docstrings
    # name as these checkpoints' (as experiments/hf_memory_table.py counts them)
    "deepseek-ai/DeepSeek-V3.2-Exp": dict(
        GQA, model_type="deepseek_v32", vocab_size=129280, hidden_size=7168,
        intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61,
        num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
        n_routed_experts=256, num_experts_per_tok=8, first_k_dense_replace=3,
        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, n_group=8, topk_group=4, norm_topk_prob=True,
        routed_scaling_factor=2.5, index_topk=2048, index_n_heads=64, index_head_dim=128,
        rope_theta=10000.0),
    "deepseek-ai/DeepSeek-V4-Flash-Base": dict(
        GQA, model_type="deepseek_v4", vocab_size=129280, hidden_size=4096,
        moe_intermediate_size=2048, num_hidden_layers=43, num_attention_heads=64, head_dim=512,
        q_lora_rank=1024, qk_rope_head_dim=64, n_routed_experts=256, num_experts_per_tok=6,
        n_shared_experts=1, num_hash_layers=3, routed_scaling_factor=1.5,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        hc_mult=4, hc_sinkhorn_iters=20, sliding_window=128, o_groups=8, o_lora_rank=1024,
        index_n_heads=64, index_head_dim=128, index_topk=512, swiglu_limit=10.0),
    # its text_config as public code quotes it (not checked against the Hub); the text-only
    # model_type, which transformers' causal-LM class counts without the vision tower
    "google/gemma-4-26B-A4B-it": dict(
        model_type="gemma4_text", vocab_size=262144, hidden_size=2816, intermediate_size=2112,
        num_hidden_layers=30, num_attention_heads=16, num_key_value_heads=8, head_dim=256,
        global_head_dim=512, num_global_key_value_heads=2, attention_k_eq_v=True,
        enable_moe_block=True, num_experts=128, top_k_experts=8, moe_intermediate_size=704,
        hidden_size_per_layer_input=0, num_kv_shared_layers=0, tie_word_embeddings=True,
        layer_types=["full_attention" if i % 6 == 5 else "sliding_attention"
                     for i in range(30)]),
}
