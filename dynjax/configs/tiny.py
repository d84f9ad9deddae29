"""Tiny byte-level models for a CPU: 4 layers, d=128, trained on the embedded corpus.

    python train.py --config=configs/tiny.py:feature_gate --workdir=runs/tiny_feature_gate

Variants: dense, uniform, layer_static, feature_gate, fixed_depth2 (any fixed_depthK).
Expected: test bits-per-byte of about 2.2-2.4 after 600 steps, a few minutes on 2 cores.
Mass-matched uniform: --config=configs/tiny.py:uniform --config.mass_match_run=RUN_DIR.
"""
from dynjax.configs import common


def get_config(variant: str = "feature_gate"):
    c = common.base(variant)
    c.model.scan_layers = False  # 4 layers unrolled run ~30% faster on CPU than scanned
    c.train.steps = 600
    return c
