"""Frozen-Controller Audit of the public MUDDPythia-1.4B checkpoint (the paper's external control).

    python audit.py --config=configs/audit_muddpythia.py --muddpythia=/path/to/MUDDPythia-1.4B \\
        --config.data.validation_path=/path/to/wikitext-103-raw/wiki.valid.raw \\
        --config.data.test_path=/path/to/wikitext-103-raw/wiki.test.raw --out=runs/audit_mudd

configs/audit_tiny.py's protocol on 512 + 512 windows of WikiText-103 (needs ``pip install
tokenizers``). Paper: cross_input 1.9067, token_shuffle 2.9637, StaticMixMean 1.9798.
Not run in this repository (no checkpoint, no GPU); its path is tested on a tiny MUDDPythia.
Depth: docs/audit.md#the-muddpythia-14b-audit-config-dynjaxconfigsaudit_muddpythiapy
"""
from dynjax.configs import audit_tiny


def get_config():
    c = audit_tiny.get_config()
    c.data.calib_windows = 512
    c.data.eval_windows = 512
    c.data.seq_len = 512
    c.batch_size = 8
    c.max_reassign_bytes = 16 << 30
    c.muddpythia.dtype = "float32"
    return c
