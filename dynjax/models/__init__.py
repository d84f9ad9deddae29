"""Every model family, built by one function with one interface.

``build(cfg)`` returns a model with ``init(key, inputs)``, ``apply(params, inputs,
coeffs=None) -> (logits, coeffs)`` (record without coeffs, replay with them), ``schema`` (the
coefficients' named axes) and ``logical_axes(inputs)`` (each parameter's sharding names), so
training, decoding, measuring and the audit never ask which family they hold.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from dynjax import coeffs as coeffs_lib
from dynjax.models import deepseek_v4, gated_mlp, gates, llm, mod, moe, mudd, muddpythia
from dynjax.models.transformer import ModelConfig


@dataclasses.dataclass(frozen=True)
class Family:
    """How to build one family: its config type, the model made from it, its variants."""

    config: type
    make: Callable
    variants: tuple


def _decoder(module_cls, schema_fn):
    return lambda cfg: Model(cfg, module_cls, schema_fn)


FAMILIES = {
    "gates": Family(ModelConfig, _decoder(gates.GatedDecoder, gates.schema), gates.VARIANTS),
    "mod": Family(ModelConfig, _decoder(mod.ModDecoder, mod.schema), mod.VARIANTS),
    "moe": Family(ModelConfig, _decoder(moe.MoeDecoder, moe.schema), moe.VARIANTS),
    "mudd": Family(ModelConfig, _decoder(mudd.MuddDecoder, mudd.schema), mudd.VARIANTS),
    "gated_mlp": Family(gated_mlp.MLPConfig, gated_mlp.GatedMLP, gated_mlp.VARIANTS),
    "muddpythia": Family(muddpythia.Config, muddpythia.MuddPythia, ("muddpythia",)),
    "llm": Family(llm.Config, llm.LLM, ("llm",)),
    "deepseek_v4": Family(deepseek_v4.Config, deepseek_v4.DeepseekV4, ("deepseek_v4",)),
}


class Model:
    """A decoder's Linen module applied functionally; params are a plain (unboxed) pytree."""

    def __init__(self, cfg: ModelConfig, module_cls, schema_fn):
        if cfg.variant not in FAMILIES[cfg.family].variants:
            raise ValueError(f"unknown model.variant={cfg.variant!r} for family "
                             f"{cfg.family!r}; choose one of {list(FAMILIES[cfg.family].variants)}")
        if cfg.variant == "fixed_depth" and not 0 < cfg.gates.fixed_depth <= cfg.n_layers:
            raise ValueError(f"model.fixed_depth={cfg.gates.fixed_depth} must be in "
                             f"1..n_layers={cfg.n_layers} for the fixed_depth variant")
        self.cfg = cfg
        self.module = module_cls(cfg)
        self.schema = schema_fn(cfg)

    def init(self, key, tokens):
        """Fresh parameters, computed as one compiled program: op by op, a scanned stack
        compiles its scan and every small op apart (several times slower; same values)."""
        return self._init(key, tokens)

    @functools.cached_property
    def _init(self):
        def init_params(key, tokens):
            return nn.meta.unbox(self.module.init(key, tokens)["params"])
        return jax.jit(init_params)

    def logical_axes(self, tokens):
        """Logical axis names of every parameter (a pytree of PartitionSpec)."""
        boxed = jax.eval_shape(self.module.init, jax.random.key(0), tokens)["params"]
        return nn.get_partition_spec(boxed)

    def apply(self, params, tokens, coeffs=None, *, with_aux=False):
        """``(logits, coeffs)``; with ``with_aux`` also a dict of auxiliary training losses
        that modules sow into the ``aux_loss`` collection (already weighted, summed by the
        train step), e.g. a router's load-balancing loss.

        ``coeffs``: None records, a coefficient pytree replays, a
        :class:`~dynjax.coeffs.Given` is either, as its flag says (:mod:`dynjax.coeffs`)."""
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


def family_of(cfg) -> str:
    """The family a config (a dict or any family's config object) describes."""
    if isinstance(cfg, Mapping):
        return cfg.get("family", "gates")
    if isinstance(cfg, ModelConfig):
        return cfg.family
    for name, fam in FAMILIES.items():
        if isinstance(cfg, fam.config):
            return name
    raise TypeError(f"build() takes a dict or a family's config, not {type(cfg).__name__}")


def _config_from_dict(config_cls, d):
    if hasattr(config_cls, "from_dict"):
        return config_cls.from_dict(d)
    known = {f.name for f in dataclasses.fields(config_cls)}
    if set(d) - known:
        raise ValueError(f"unknown model config field(s) {sorted(set(d) - known)}; known "
                         f"fields: {sorted(known)}")
    return config_cls(**d)


def build(cfg):
    """The model a config describes: a dict (``family`` picks the family, default "gates";
    ``to_dict()`` of a ConfigDict works) or a family's config object."""
    family = family_of(cfg)
    if family not in FAMILIES:
        raise ValueError(f"unknown model.family={family!r}; known: {sorted(FAMILIES)}")
    fam = FAMILIES[family]
    if isinstance(cfg, Mapping):
        d = dict(cfg)
        if fam.config is not ModelConfig:
            d.pop("family", None)
        cfg = _config_from_dict(fam.config, d)
    return fam.make(cfg)
