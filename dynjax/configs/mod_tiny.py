"""Tiny byte-level Mixture-of-Depths model and its dense twin, trained on the embedded corpus.

    python train.py --config=configs/mod_tiny.py:mod --workdir=runs/mod_tiny
    python train.py --config=configs/mod_tiny.py:dense --workdir=runs/mod_tiny_dense

4 blocks, d=128; ``mod``: blocks 1 and 3 are MoD blocks with capacity c = 0.125 (each
processes 16 of 128 tokens), router weight sigmoid(r), and both causal-decoding aux losses
(router BCE, predictor BCE) logged as aux/router_bce and aux/predictor_bce. ``dense`` has
the same blocks and parameters minus the routers. Both variants: 600 steps. Evaluation
reports top-k (non-causal), router and predictor bits/byte; the headline is the predictor.
MoD against dense at equal training FLOPs: ``python experiments/mod_isoflop.py`` (3 seeds:
MoD predictor 2.3733 vs dense 2.3931 test bits/byte). Routing report of a finished run
(precision / recall / F1 of the decode rules): ``python experiments/mod_routing_report.py RUN_DIR``.
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
