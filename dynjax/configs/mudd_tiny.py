"""Tiny byte-level MUDD models (dynamic dense cross-layer mixing) on the embedded corpus.

    python train.py --config=configs/mudd_tiny.py:mudd --workdir=runs/mudd_tiny
    python train.py --config=configs/mudd_tiny.py:mudd_static --workdir=runs/mudd_tiny_static

Same size budget and training as configs/tiny.py (4 layers, d=128, 4 heads, d_ff=512,
seq 128, batch 32, 600 steps); the DA MLPs (hidden 64) add 4% parameters
(0.89M; mudd_static 0.85M like feature_gate). ``mudd``: per-token
DA coefficients plus a static bias; ``mudd_static``: the static bias only.
Expected (measured, seed 0, ``--config.train.steps=400`` as compare_fca.sh trains it): test
2.52 bits/byte (tiny feature_gate, same seed and steps: 2.54); ~6 CPU-minutes.
Audit beside FeatureGate: ``bash experiments/compare_fca.sh``.
"""
from dynjax.configs import common
from dynjax.models.mudd import VARIANTS


def get_config(variant: str = "mudd"):
    c = common.family_base("mudd", variant, VARIANTS)
    c.model.scan_layers = False  # MUDD layers are always unrolled (see dynjax/models/mudd.py)
    c.model.mudd_da_hidden = 64
    c.train.steps = 600
    return c
