"""Real production LLM configs (their published config.json's architecture fields, copied in
dynjax/loaders/hf_architectures.py) as training configs for the memory plan.

    python plan.py --config=configs/hf_llm.py:olmoe_1b_7b --mesh=data=1,fsdp=8,tensor=8 \\
        --preset=ep --out=results/plan_hf/olmoe_1b_7b.json    # also qwen3_30b_a3b, mixtral_8x7b
    python -m dynjax.programs.plan --config=dynjax:hf_llm:deepseek_v4_flash \\
        --mesh=data=1,fsdp=32,tensor=8 --preset=ep    # also deepseek_v32 (docs/hf.md)

bfloat16 with remat; ``ep`` puts the experts on the tensor axis; batch 64 of 2048 tokens.
Depth: docs/multihost.md#production-llm-configs-dynjaxconfigshf_llmpy
"""
import dataclasses

import ml_collections

from dynjax.configs import tiny

MODELS = {"olmoe_1b_7b": "allenai/OLMoE-1B-7B-0924", "qwen3_30b_a3b": "Qwen/Qwen3-30B-A3B",
          "mixtral_8x7b": "mistralai/Mixtral-8x7B-v0.1", "qwen1_5_moe_a2_7b": "Qwen/Qwen1.5-MoE-A2.7B",
          "deepseek_v32": "deepseek-ai/DeepSeek-V3.2-Exp",
          "deepseek_v4_flash": "deepseek-ai/DeepSeek-V4-Flash-Base"}


def get_config(arg: str = "olmoe_1b_7b"):
    from dynjax.loaders import hf
    from dynjax.loaders.hf_architectures import PUBLISHED_FIELDS
    from dynjax.models import family_of

    if arg not in MODELS:
        raise ValueError(f"unknown model {arg!r}; choose one of {sorted(MODELS)}")
    c = tiny.get_config()
    cfg = hf.config_from_hf(PUBLISHED_FIELDS[MODELS[arg]], "bfloat16")
    c.model = ml_collections.ConfigDict(dict(dataclasses.asdict(cfg), family=family_of(cfg),
                                             remat=True))
    c.data.seq_len = 2048
    c.train.batch_size = 64
    return c
