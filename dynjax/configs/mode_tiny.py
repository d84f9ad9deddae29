"""Tiny byte-level MoDE models (Mixture-of-Depths-and-Experts), both forms, on the embedded corpus.

    python train.py --config=configs/mode_tiny.py:mode_staged --workdir=runs/mode_staged_tiny
    python train.py --config=configs/mode_tiny.py:mode_integrated --workdir=runs/mode_integrated_tiny
    python audit.py --config=configs/audit_tiny.py --out=runs/audit_mode_staged \
        --checkpoints runs/mode_staged_tiny

Same size and training as configs/mod_tiny.py (4 blocks, d=128, seq 128, 600 steps), with
4 experts of d_ff=512, top-1 token-choice routing, capacity factor 1.25:

- ``mode_staged`` (family mod): blocks 1 and 3 are MoD blocks (c = 0.125: 16 of 128 tokens
  enter) whose FFN is the MoE layer, run on the routed tokens only; blocks 0 and 2 are dense.
  Coefficients: MoD router scores and the MoE routing of the routed tokens.
- ``mode_integrated`` (family moe): every block's MoE router has a fifth, no-op expert; a
  token routed there skips the FFN. Coefficients: the 5-way routing probabilities.

``--config.model.moe_dispatch=dropless``: sort by expert, nothing dropped (docs/moe.md); with
``--config.sharding.preset=ep`` the experts split over the ``tensor`` mesh axis.
"""
from dynjax.configs import mod_tiny

VARIANTS = ("mode_staged", "mode_integrated")
MOE = dict(moe_num_experts=4, moe_num_experts_per_tok=1, moe_routing="token_choice",
           moe_capacity_factor=1.25, moe_load_balance_loss_weight=0.01,
           moe_router_z_loss_weight=0.001, moe_dispatch="onehot")


def get_config(variant: str = "mode_staged"):
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {list(VARIANTS)}")
    c = mod_tiny.get_config("mod")       # MoD fields, sizes and training
    c.model.variant = variant
    if variant == "mode_integrated":
        c.model.family = "moe"           # the MoD fields are then ignored
    c.model.update(MOE)
    return c
