"""Tiny byte-level Mixture-of-Experts model (token-choice top-1 over 4 experts in every block).

    python train.py --config=configs/moe_tiny.py:moe --workdir=runs/moe_tiny
    python train.py --config=configs/moe_tiny.py:moe --workdir=runs/moe_upcycled \\
        --config.train.init_from=runs/mod_tiny_dense --config.train.steps=60

Same sizes and training as configs/mod_tiny.py (4 blocks, d=128, seq 128, 600 steps) and the
MoE fields of configs/mode_tiny.py (d_ff=512 per expert, capacity factor 1.25). With
``train.init_from`` a dense run of that size (configs/mod_tiny.py:dense) is upcycled: every
expert starts as its block's MLP (experiments/conversion.py compares it with this from scratch).
"""
from dynjax.configs import mode_tiny

VARIANTS = ("moe", "mode_integrated")


def get_config(variant: str = "moe"):
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {list(VARIANTS)}")
    c = mode_tiny.get_config("mode_integrated")   # family moe with the MoE fields
    c.model.variant = variant
    return c
