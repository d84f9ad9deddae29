"""Tiny byte-level Mixture-of-Depths model and its dense twin, trained on the embedded corpus.

    python train.py --config=configs/mod_tiny.py:mod --workdir=runs/mod_tiny
    python train.py --config=configs/mod_tiny.py:dense --workdir=runs/mod_tiny_dense

4 blocks, d=128, 600 steps; ``mod``: blocks 1 and 3 are MoD blocks (c = 0.125) with both
causal aux losses; evaluation's headline is the predictor. Expected at equal training FLOPs
(``experiments/mod_isoflop.py``, 3 seeds): MoD 2.3733 vs dense 2.3931 test bits/byte.
Depth: docs/models.md#the-tiny-mod-config-dynjaxconfigsmod_tinypy
"""
from dynjax.configs import common
from dynjax.models.mod import VARIANTS


def get_config(variant: str = "mod"):
    c = common.family_base("mod", variant, VARIANTS)
    c.model.scan_layers = False  # 4 layers unrolled run faster on CPU than scanned
    c.model.update(dict(mod_capacity=0.125, mod_every=2, mod_layers=(), mod_router_weight="sigmoid",
                        mod_route="topk", mod_bce_weight=0.01, mod_predictor_weight=0.01,
                        mod_predictor_hidden=32))
    c.train.steps = 600
    return c
