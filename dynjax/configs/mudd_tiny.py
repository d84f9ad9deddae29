"""Tiny byte-level MUDD models (dynamic dense cross-layer mixing) on the embedded corpus.

    python train.py --config=configs/mudd_tiny.py:mudd --workdir=runs/mudd_tiny
    python train.py --config=configs/mudd_tiny.py:mudd_static --workdir=runs/mudd_tiny_static

configs/tiny.py's size and training; the DA MLPs add 4% parameters. Expected (seed 0,
``--config.train.steps=400`` as compare_fca.sh trains it): test 2.52 bits/byte (tiny
feature_gate: 2.54); ~6 CPU-minutes. Audit beside FeatureGate: ``bash experiments/compare_fca.sh``.
Depth: docs/models.md#the-tiny-mudd-config-dynjaxconfigsmudd_tinypy
"""
from dynjax.configs import common
from dynjax.models.mudd import VARIANTS


def get_config(variant: str = "mudd"):
    c = common.family_base("mudd", variant, VARIANTS)
    c.model.scan_layers = False  # MUDD layers are always unrolled (see dynjax/models/mudd.py)
    c.model.mudd_da_hidden = 64
    c.train.steps = 600
    return c
