"""Routing audit of a Hugging Face MoE checkpoint (Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE).

    python audit.py --config=configs/audit_hf.py --hf=/path/to/OLMoE-1B-7B-0924 --out=runs/audit_olmoe

The directory holds config.json, *.safetensors and tokenizer.json. Prints a memory and FLOP
estimate first (add ``--config.hf.flops_per_second=4e14`` for a time), then records the
router scores (softmax over experts, before top-k) of 64 calibration windows (the validation
text) and 64 evaluation windows (the test text) of 256 tokens, tokenized with the
checkpoint's tokenizer.json: dynjax's embedded corpus, or ``--config.data.source=files
--config.data.path=FILE_OR_FOLDER``. Checks bitwise replay, then every condition of
configs/audit_tiny.py plus the routing ones: token_identity (is routing a lookup table of the
token id?), expert_relabel (a per-layer derangement of the experts: must hurt), weights_flat
(each token's top-k experts with equal weights). One checkpoint: intervals are over windows
and reassignments. docs/audit_hf.md shows an audit of a tiny random checkpoint.

A checkpoint that records several coefficient families (Qwen3.5-MoE: router, shared_gate,
attn_gate, deltanet_beta, deltanet_decay) gets one table per family: ``--config.sites=
router,attn_gate`` picks the families to intervene on (default ``all``: every family the
checkpoint records); the main table intervenes on them together, each family's table on it
alone, every other coefficient replayed as recorded (dynjax/audit/families.py).
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
