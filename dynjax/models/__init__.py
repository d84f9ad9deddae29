"""Model families, each a pure function of (params, tokens, coeffs) with a coefficient schema.

``build(cfg)`` returns a :class:`Model`:

    model = build(ModelConfig(...))
    params = model.init(key, tokens)
    logits, coeffs = model.apply(params, tokens)                 # record
    logits2, _     = model.apply(params, tokens, coeffs=coeffs)  # replay, controller not run
"""
from __future__ import annotations

import flax.linen as nn
import jax

from dynjax import coeffs as coeffs_lib
from dynjax.models import gates
from dynjax.models.transformer import ModelConfig

# family name -> (module class, schema function, variant names)
FAMILIES = {"gates": (gates.GatedDecoder, gates.schema, gates.VARIANTS)}


class Model:
    """A Linen module applied functionally; params are a plain (unboxed) pytree."""

    def __init__(self, cfg: ModelConfig):
        if cfg.family not in FAMILIES:
            raise ValueError(f"unknown model.family={cfg.family!r}; known: {sorted(FAMILIES)}")
        module_cls, schema_fn, variants = FAMILIES[cfg.family]
        if cfg.variant not in variants:
            raise ValueError(f"unknown model.variant={cfg.variant!r} for family "
                             f"{cfg.family!r}; choose one of {list(variants)}")
        if cfg.variant == "fixed_depth" and not 0 < cfg.fixed_depth <= cfg.n_layers:
            raise ValueError(f"model.fixed_depth={cfg.fixed_depth} must be in "
                             f"1..n_layers={cfg.n_layers} for the fixed_depth variant")
        self.cfg = cfg
        self.module = module_cls(cfg)
        self.schema = schema_fn(cfg)

    def init(self, key, tokens):
        return nn.meta.unbox(self.module.init(key, tokens)["params"])

    def logical_axes(self, tokens):
        """Logical axis names of every parameter (a pytree of PartitionSpec)."""
        boxed = jax.eval_shape(self.module.init, jax.random.key(0), tokens)["params"]
        return nn.get_partition_spec(boxed)

    def apply(self, params, tokens, coeffs=None):
        if coeffs is not None:
            coeffs_lib.check(coeffs, self.schema)
            if not self.schema:
                coeffs = None
        return self.module.apply({"params": params}, tokens, coeffs)


def build(cfg) -> Model:
    if not isinstance(cfg, ModelConfig):
        cfg = ModelConfig.from_dict(cfg)
    return Model(cfg)
