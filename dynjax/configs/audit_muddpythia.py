"""Frozen-Controller Audit of the public MUDDPythia-1.4B checkpoint (the paper's external control).

    python audit.py --config=configs/audit_muddpythia.py --muddpythia=/path/to/MUDDPythia-1.4B \
        --config.data.validation_path=/path/to/wikitext-103-raw/wiki.valid.raw \
        --config.data.test_path=/path/to/wikitext-103-raw/wiki.test.raw --out=runs/audit_mudd

The directory holds the HF files (config.json, *.safetensors, tokenizer.json; the paper used
Caiyun-AI/MUDDPythia-1.4B at commit 3c241c8; needs ``pip install tokenizers``). Prints a
memory and FLOP estimate first (add ``--config.muddpythia.flops_per_second=4e14`` for a time),
then runs the same protocol as configs/audit_tiny.py: 512 calibration windows from the
validation text, 512 evaluation windows from the test text (fewer if the text is shorter; the
report notes it), 20 paired reassignments, StaticMixMean / Layer×PositionMean /
SourceUniformMean. One public checkpoint: intervals are over windows and reassignments.
Paper: cross_input 1.9067, token_shuffle 2.9637, StaticMixMean 1.9798, Layer×PositionMean
1.0190, SourceUniformMean 7.4237 (its window length is not stated; 512 tokens here).
Not run in this repository (no checkpoint, no GPU); its path is tested on a tiny MUDDPythia.
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
