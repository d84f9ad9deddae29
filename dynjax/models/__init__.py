"""Model families, each a pure function of (params, tokens, coeffs) with a coefficient schema.

``build(cfg)`` returns a :class:`Model`:

    model = build(ModelConfig(...))
    params = model.init(key, tokens)
    logits, coeffs = model.apply(params, tokens)                 # record
    logits2, _     = model.apply(params, tokens, coeffs=coeffs)  # replay: the given values
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from dynjax import coeffs as coeffs_lib
from dynjax.models import gates, mod, moe, mudd
from dynjax.models.transformer import ModelConfig

# family name -> (module class, schema function, variant names)
FAMILIES = {"gates": (gates.GatedDecoder, gates.schema, gates.VARIANTS),
            "mod": (mod.ModDecoder, mod.schema, mod.VARIANTS),
            "moe": (moe.MoeDecoder, moe.schema, moe.VARIANTS),
            "mudd": (mudd.MuddDecoder, mudd.schema, mudd.VARIANTS)}


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

    def apply(self, params, tokens, coeffs=None, *, with_aux=False):
        """``(logits, coeffs)``; with ``with_aux`` also a dict of auxiliary training losses
        that modules sow into the ``aux_loss`` collection (already weighted, summed by the
        train step), e.g. a router's load-balancing loss.

        ``coeffs``: None records, a coefficient pytree replays, a
        :class:`~dynjax.coeffs.Given` is either, as its flag says (one compiled program for
        both modes: what the audit engine passes)."""
        given = coeffs_lib.as_given(coeffs)
        if given.values is not None:
            coeffs_lib.check(given.values, self.schema)
        if not with_aux:
            return self.module.apply({"params": params}, tokens, given)
        (logits, coeffs), sown = self.module.apply({"params": params}, tokens, given,
                                                   mutable=["aux_loss"])
        aux = {"/".join(str(getattr(k, "key", k)) for k in path): jnp.sum(sum(v))
               for path, v in jax.tree_util.tree_flatten_with_path(
                   sown.get("aux_loss", {}), is_leaf=lambda x: isinstance(x, tuple))[0]}
        return logits, coeffs, aux


def build(cfg) -> Model:
    if not isinstance(cfg, ModelConfig):
        cfg = ModelConfig.from_dict(cfg)
    return Model(cfg)
