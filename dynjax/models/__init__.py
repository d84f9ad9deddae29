"""Every model family, built by one function with one interface.

``build(cfg)`` returns a model with ``init(key, inputs)``, ``apply(params, inputs,
coeffs=None) -> (logits, coeffs)`` (record without coeffs, replay with them), ``schema`` (the
coefficients' named axes) and ``logical_axes(inputs)`` (each parameter's sharding names), so
training, decoding, measuring and the audit never ask which family they hold. What they do
ask a family (its routes, routing facts, dense twin, ...) is its record, ``FAMILIES[name]``.
"""
from __future__ import annotations

import dataclasses
import functools
from types import ModuleType
from typing import Callable, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from dynjax import coeffs as coeffs_lib
from dynjax import runtime
from dynjax.models import deepseek_v4, gated_mlp, gates, llm, mod, moe, mudd, muddpythia
from dynjax.models.components.routers import ROUTERS
from dynjax.models.transformer import ModelConfig

runtime.unroll_threefry_on_cpu()   # every init draws its parameters through it


@dataclasses.dataclass(frozen=True)
class Routing:
    """An MoE model's routing facts (the audit's conditions, expert importance)."""

    num_experts: int
    top_k: int
    token_choice: bool   # each token picks its experts (removing one re-routes its tokens)


def _forward_only(cfg) -> dict:
    return {"forward": (cfg, True)}


def _no_routing(cfg) -> Optional[Routing]:
    return None


def _no_summary(cfg, coeffs) -> dict:
    return {}


def _router_entropy(leaves) -> dict:
    """Mean and maximum entropy (nats) of router distributions (.., E)."""
    ent = [-np.sum(p * np.log(np.clip(p, 1e-12, None)), axis=-1)
           for p in (np.asarray(x, np.float64) for x in leaves)]
    return {"routing_entropy_nats": float(np.mean([e.mean() for e in ent])),
            "routing_entropy_max_nats": float(np.log(np.shape(leaves[0])[-1]))}


def _router_leaves(coeffs) -> list:
    return coeffs["router"] if isinstance(coeffs["router"], list) else [coeffs["router"]]


def _mod_summary(cfg, coeffs) -> dict:
    if "router" not in coeffs:
        return {}
    ask = coeffs.get("predictor", coeffs["router"])
    return {"entered_fraction_topk": cfg.mod.capacity,
            "asks_to_enter_fraction": float(np.mean(np.asarray(ask) > 0))}


def _moe_summary(cfg, coeffs) -> dict:
    return _router_entropy(_router_leaves(coeffs)) if "router" in coeffs else {}


def _llm_summary(cfg, coeffs) -> dict:
    """The recorded scores may be logits (gpt-oss): the router's probabilities."""
    if "router" not in coeffs:
        return {}
    dist = ROUTERS[cfg.router].distribution
    return _router_entropy([dist(cfg, p) for p in _router_leaves(coeffs)])


def _moe_routing(cfg) -> Routing:
    return Routing(cfg.moe.num_experts, cfg.moe.num_experts_per_tok,
                   cfg.moe.routing == "token_choice")


def _llm_routing(cfg) -> Optional[Routing]:
    return Routing(cfg.num_experts, cfg.top_k, True) if cfg.moe_layers else None


def _own_dense_variant(cfg):
    return cfg.replace(variant="dense")


def _dense_gates_of_same_size(cfg) -> ModelConfig:
    return ModelConfig(family="gates", variant="dense", vocab_size=cfg.vocab_size,
                       d_model=cfg.d_model, n_heads=cfg.n_heads, n_layers=cfg.n_layers,
                       d_ff=cfg.d_ff, dtype=cfg.dtype, scan_layers=cfg.scan_layers)


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family: what callers ask a family instead of branching on its name. The
    per-layer registries (decoding, training hooks, FLOPs, conversion) name every family too,
    supporting or refusing it (tests/test_families.py walks them; docs/contributing.md)."""

    name: str
    config: type                  # its config class (``ModelConfig``: the core's sections)
    make: Callable                # config -> model (init / apply / schema / logical_axes)
    variants: tuple
    module: ModuleType            # dynjax.models.<module>: the forward pass
    task: str = "lm"              # "lm" (next-token windows) | "classifier" (examples)
    section: Optional[str] = None  # its ModelConfig section (``sections.py``), if any
    eval_routes: Callable = _forward_only    # cfg -> {route: (cfg, causal?)}
    routing: Callable = _no_routing          # cfg -> Routing | None
    routing_summary: Callable = _no_summary  # (cfg, coeffs) -> the scorecard's routing rows
    dense_twin: Optional[Callable] = None    # cfg -> the same-size dense model it is timed
    #                                          against (None: its execution panel has its own)
    exports_hf: bool = False      # its layers are Hugging Face architectures (export.py)
    aliases: Mapping = dataclasses.field(default_factory=dict)  # old config.json name -> new


def _decoder(module_cls, schema_fn):
    return lambda cfg: Model(cfg, module_cls, schema_fn)


FAMILIES = {f.name: f for f in (
    Family("gates", ModelConfig, _decoder(gates.GatedDecoder, gates.schema), gates.VARIANTS,
           gates, section="gates", dense_twin=_own_dense_variant),
    Family("mod", ModelConfig, _decoder(mod.ModDecoder, mod.schema), mod.VARIANTS, mod,
           section="mod", eval_routes=mod.eval_routes, routing_summary=_mod_summary,
           dense_twin=_own_dense_variant),
    Family("moe", ModelConfig, _decoder(moe.MoeDecoder, moe.schema), moe.VARIANTS, moe,
           section="moe", eval_routes=moe.eval_routes, routing=_moe_routing,
           routing_summary=_moe_summary, dense_twin=_dense_gates_of_same_size),
    Family("mudd", ModelConfig, _decoder(mudd.MuddDecoder, mudd.schema), mudd.VARIANTS, mudd,
           section="mudd", dense_twin=_dense_gates_of_same_size),
    Family("gated_mlp", gated_mlp.MLPConfig, gated_mlp.GatedMLP, gated_mlp.VARIANTS, gated_mlp,
           task="classifier", routing_summary=_moe_summary,
           dense_twin=lambda cfg: dataclasses.replace(cfg, variant="dense")),
    Family("muddpythia", muddpythia.Config, muddpythia.MuddPythia, ("muddpythia",),
           muddpythia),
    Family("llm", llm.Config, llm.LLM, ("llm",), llm, eval_routes=llm.eval_routes,
           routing=_llm_routing, routing_summary=_llm_summary, exports_hf=True,
           aliases=llm.RENAMED),
    Family("deepseek_v4", deepseek_v4.Config, deepseek_v4.DeepseekV4, ("deepseek_v4",),
           deepseek_v4, routing=lambda cfg: Routing(cfg.num_experts, cfg.top_k, True)),
)}


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


def canonical(model: Mapping) -> dict:
    """A model config dict with its family's old names (``Family.aliases``) under today's:
    a run's config.json from before a rename builds, resumes and compares as it did."""
    d = dict(model)
    family = FAMILIES.get(d.get("family", "gates"))
    for old, new in (family.aliases if family else {}).items():
        if old in d:
            value = d.pop(old)
            d.setdefault(new, value)
    return d


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
        d = canonical(cfg)
        if fam.config is not ModelConfig:
            d.pop("family", None)
        cfg = _config_from_dict(fam.config, d)
    return fam.make(cfg)
