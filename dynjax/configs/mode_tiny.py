"""Tiny byte-level MoDE models (Mixture-of-Depths-and-Experts), both forms, on the embedded corpus.

    python train.py --config=configs/mode_tiny.py:mode_staged --workdir=runs/mode_staged_tiny
    python train.py --config=configs/mode_tiny.py:mode_integrated --workdir=runs/mode_integrated_tiny
    python audit.py --config=configs/audit_tiny.py --out=runs/audit_mode_staged \\
        --checkpoints runs/mode_staged_tiny

configs/mod_tiny.py's size and training with 4 experts, top-1, capacity factor 1.25:
``mode_staged`` (MoD blocks whose FFN is the MoE), ``mode_integrated`` (a no-op fifth
expert). ``--config.model.moe_dispatch=dropless``: nothing dropped. Depth: docs/models.md#the-tiny-mode-config-dynjaxconfigsmode_tinypy
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
