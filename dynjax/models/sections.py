"""Each dynamic family's own section of ``ModelConfig``, and the flat names users type for it.

A section is a frozen (so hashable: ``ModelConfig`` is a Linen field) dataclass whose fields
its family reads as ``cfg.<section>.<field>`` (``cfg.mod.capacity``). Config files, command
lines (``--config.model.mod_capacity=0.5``) and the config.json of every stored run keep one
flat namespace: a field's flat name is its section's ``PREFIX`` plus its name, so
``mod_capacity`` is ``cfg.mod.capacity``; the gate family's prefix is empty
(``fixed_depth`` is ``cfg.gates.fixed_depth``). A new family adds a class here and a field
of that type to ``ModelConfig``; the flat names follow.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar, Mapping, Optional


@dataclasses.dataclass(frozen=True)
class GateConfig:
    """Residual-gate family (dynjax.models.gates)."""

    PREFIX: ClassVar[str] = ""
    fixed_depth: int = 0           # fixed_depth variant: number of executed blocks
    gate_max: float = 2.0          # feature_gate: g = gate_max * sigmoid(controller)
    controller_hidden: int = 16
    uniform_value: Optional[float] = None  # uniform: a fixed (mass-matched) gate, not learned


@dataclasses.dataclass(frozen=True)
class ModConfig:
    """Mixture-of-Depths (dynjax.models.mod)."""

    PREFIX: ClassVar[str] = "mod_"
    capacity: float = 0.125        # c: a MoD block processes k = floor(c * T) tokens
    every: int = 2                 # every mod_every-th block is a MoD block (blocks 1, 3, ...)
    layers: tuple = ()             # explicit MoD block indices; overrides mod_every if given
    router_weight: str = "sigmoid"  # the update's multiplier: "raw" r or "sigmoid" sigmoid(r)
    route: str = "topk"            # "topk" (training) or causal decoding: "router" | "predictor"
    bce_weight: float = 0.01       # aux BCE: router logit predicts top-k membership
    predictor_weight: float = 0.01  # aux BCE: stop-gradient MLP predicts top-k membership
    predictor_hidden: int = 32
    decode_slots: int = 0          # causal routing: at most this many tokens enter a MoD block
                                   # per sequence (later askers skip); 0: no limit

    def __post_init__(self):  # a list from JSON or a ConfigDict becomes a (hashable) tuple
        object.__setattr__(self, "layers", tuple(self.layers))


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    """Mixture-of-Experts FFN (dynjax.models.moe); MaxText's names behind the moe_ prefix."""

    PREFIX: ClassVar[str] = "moe_"
    num_experts: int = 4
    num_experts_per_tok: int = 1   # token choice: top-k experts per token
    routing: str = "token_choice"  # or "expert_choice" (each expert takes its top tokens)
    capacity_factor: float = 1.25  # expert buffer ceil(cf * k * T / E); <= 0: never drop
    priority: str = "choice"       # buffer order: "choice" (GShard: all first choices first)
                                   # or "position" (token order: causal)
    dispatch: str = "onehot"       # "onehot" (GShard buffers, capacity) or "dropless" (sort by
                                   # expert, grouped matmul, nothing dropped; token choice)
    load_balance_loss_weight: float = 0.01
    router_z_loss_weight: float = 0.001


@dataclasses.dataclass(frozen=True)
class MuddConfig:
    """MUDD (dynjax.models.mudd): dynamic dense cross-layer mixing."""

    PREFIX: ClassVar[str] = "mudd_"
    da_hidden: int = 64            # hidden width of each layer's DA coefficient MLP


def flat_names(sections: Mapping[str, type]) -> dict:
    """``{flat name: (section attribute, field)}`` of the section classes ``{attribute: cls}``."""
    return {cls.PREFIX + f.name: (attr, f.name)
            for attr, cls in sections.items() for f in dataclasses.fields(cls)}


def flatten(cfg, sections: Mapping[str, type]) -> dict:
    """The flat ``{flat name: value}`` view of the sections of ``cfg``."""
    return {flat: getattr(getattr(cfg, attr), name)
            for flat, (attr, name) in flat_names(sections).items()}
