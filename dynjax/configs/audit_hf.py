"""Routing audit of a Hugging Face MoE checkpoint (Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE).

    python audit.py --config=configs/audit_hf.py --hf=/path/to/OLMoE-1B-7B-0924 --out=runs/audit_olmoe

Prints a memory and FLOP estimate, records the router scores of 64 + 64 windows of 256
tokens (the checkpoint's tokenizer), checks bitwise replay, then every condition of
configs/audit_tiny.py plus token_identity, expert_relabel and weights_flat; one table per
coefficient family (``--config.sites``). One checkpoint: intervals are over windows.
Depth: docs/audit_hf.md#the-config-dynjaxconfigsaudit_hfpy
"""
from dynjax.configs import audit_tiny
from dynjax.audit.interventions import REGISTRY


def get_config():
    c = audit_tiny.get_config()
    c.conditions = ",".join(REGISTRY)
    c.sites = "all"
    c.data.calib_windows = 64
    c.data.eval_windows = 64
    c.data.seq_len = 256
    c.batch_size = 8
    c.max_reassign_bytes = 4 << 30
    return c
