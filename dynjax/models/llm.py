"""Production decoder LLMs (the Hugging Face ports of ``dynjax.loaders.archs``) as one family.

One config (:class:`Config`) and one pre-norm forward pass hold every ported architecture:
the structural choices are named components (``dynjax.models.components``), and an
architecture module maps a checkpoint's config.json and tensor names onto them. The FFN is a
SwiGLU MLP or, in ``moe_layers``, the shared MoE FFN (``moe_ffn``); conversions add
load-balance training and Mixture-of-Depths layers, ``residual="hyper"`` DeepSeek-V4's mHC.
Coefficients: the routers' scores (and shared-expert gates, MoD routers, mHC mixes); replay
recomputes every selection by the router's own rule.
Depth: docs/hf.md#the-llm-family-dynjaxmodelsllmpy
"""
from __future__ import annotations

import dataclasses
import functools
import math
import zlib
from typing import ClassVar, Optional

import jax
import jax.numpy as jnp
import numpy as np

from dynjax import coeffs as coeffs_lib
from dynjax.coeffs import Axes
from dynjax.models import moe_ffn as moe_ffn_lib
from dynjax.models import matmul
from dynjax.models import mod as mod_lib
from dynjax.models.sections import ModConfig
from dynjax.models.components import deltanet
from dynjax.models.components import hyper
from dynjax.models.components import rotary as rotary_lib
from dynjax.models.components import table
from dynjax.models.components.attention import ATTENTION, LATENT_NORM_EPS
from dynjax.models.components import indexer as indexer_lib
from dynjax.models.components.experts import ACTIVATIONS, EXPERTS, mlp_rows, swiglu
from dynjax.models.components.norms import rms_norm
from dynjax.models.components import routers as routers_lib
from dynjax.models.components.routers import ROUTERS
from dynjax.models.transformer import Positions

F32 = jnp.float32
P = jax.sharding.PartitionSpec
ROUTER_AXES = Axes(("layer", "example", "token", "expert"))
SHARED_GATE_AXES = Axes(("layer", "example", "token"))
MOD_AXES = Axes(("layer", "example", "token"))
ATTN_GATE_AXES = Axes(("layer", "example", "token", "head", "unit"))
MIXERS = ("attention", "deltanet")
RESIDUALS = ("plain", "hyper")          # h + block(h) | hyper-connections (components.hyper)
QK_NORMS = ("none", "head", "full")      # none; per head (Qwen3); over all heads (OLMoE)
ROPE_TYPES = rotary_lib.ROPE_TYPES
MOE_DISPATCHES = moe_ffn_lib.DISPATCHES
MOD_ROUTES = ("topk", "router", "predictor")
# "pre_norm": h += Attn(RMS h); h += FFN(RMS h). "gemma4": each update also normed on its
# way out (sandwich norms), an MoE layer's dense MLP beside its experts, a learned scalar
# times the layer's output (Gemma-4: :func:`feed_forward`, :func:`layer`)
LAYER_FORMS = ("pre_norm", "gemma4")
# the fields Gemma-4's full-attention layers may set apart from its sliding ones
GLOBAL_LAYER_FIELDS = ("head_dim", "n_kv_heads", "rope_theta", "rope_type", "rope_factor",
                       "partial_rotary_factor", "k_eq_v")
# Old config.json names of today's fields (models.canonical reads runs made before a rename)
RENAMED = {"router_aux_loss_coef": "moe_load_balance_loss_weight"}
# The fields that say what a checkpoint computes (config_from_hf sets them); a conversion
# keeps them and adds routing (moe_*, mod_*), so they must equal the source's.
ARCHITECTURE = ("vocab_size", "hidden_size", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                "intermediate_size", "rms_norm_eps", "rope_theta", "rope_type", "rope_factor",
                "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_max_position",
                "qkv_bias", "o_bias", "qk_norm", "clip_qkv", "tie_word_embeddings",
                "attention", "partial_rotary_factor", "rope_interleave", "rope_beta_fast",
                "rope_beta_slow", "rope_mscale", "rope_mscale_all_dim",
                "rope_attention_factor", "rope_truncate", "q_lora_rank", "kv_lora_rank",
                "qk_nope_head_dim", "v_head_dim", "sliding_window", "sliding_layers",
                "swiglu_limit", "swiglu_alpha", "mixers", "deltanet_key_heads",
                "deltanet_value_heads", "deltanet_key_dim", "deltanet_value_dim",
                "deltanet_conv_kernel", "norm_offset", "attn_output_gate", "global_layer",
                "v_norm", "k_eq_v", "attention_scale", "hidden_act", "layer_form",
                "embed_scale", "final_logit_softcap")


@dataclasses.dataclass(frozen=True)
class Config:
    """One decoder LLM. Frozen and made of tuples, so it is hashable (a static jit arg)."""

    family: ClassVar[str] = "llm"    # what dynjax.decoding dispatches on

    model_type: str = "llama"        # the HF model_type this config came from (informative)
    vocab_size: int = 256
    hidden_size: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2              # grouped-query attention: n_heads / n_kv_heads per group
    head_dim: int = 16
    intermediate_size: int = 128     # the dense layers' SwiGLU width
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_type: str = "default"       # "linear" divides every frequency by rope_factor;
    rope_factor: float = 1.0         # "llama3" (Llama 3.1+) rescales the low ones smoothly
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192
    rope_beta_fast: float = 32.0     # "yarn": the rotation band between beta_slow and
    rope_beta_slow: float = 1.0      # beta_fast turns over the original context is ramped
    rope_mscale: float = 0.0         # "yarn": cos/sin scale mscale(f, rope_mscale) /
    rope_mscale_all_dim: float = 0.0  # mscale(f, rope_mscale_all_dim) when both are set
    rope_attention_factor: float = 0.0  # "yarn": that scale given outright (0: derived)
    rope_truncate: bool = True       # "yarn": round the ramp's ends to whole channels
    partial_rotary_factor: float = 1.0  # the leading fraction of each head that rotates
    rope_interleave: bool = False    # rotate pairs (2i, 2i+1) (DeepSeek), not (i, i + d/2)
    attention: str = "gqa"           # components.attention.ATTENTION
    q_lora_rank: int = 0             # "mla": the query bottleneck (0: one q projection)
    kv_lora_rank: int = 0            # "mla": the key/value latent
    qk_nope_head_dim: int = 0        # "mla": the unrotated query/key channels per head
    v_head_dim: int = 0              # "mla": the value channels per head
    index_topk: int = 0              # DeepSeek Sparse Attention (V3.2, GLM-5): each query
    index_n_heads: int = 0           # attends to the top index_topk keys of a lightning
    index_head_dim: int = 0          # indexer (components.indexer); 0: no indexer
    index_shared: tuple = ()         # GLM-5: layers reusing the previous indexer's selection
    index_rope_interleave: bool = False  # GLM-5: the indexer's rotary pairs (2i, 2i+1)
    router: str = "softmax_topk"     # components.routers.ROUTERS
    router_score: str = "softmax"    # "grouped_topk": "sigmoid" (DeepSeek-V3, GLM) | "softmax"
    router_bias: bool = False        # "grouped_topk": a selection-only bias per expert
    n_group: int = 1                 # "grouped_topk": expert groups, of which topk_group
    topk_group: int = 1              # stay eligible per token
    router_group_score: str = "top2_sum"  # a group's score: its top-2 sum | "max"
    routed_scaling_factor: float = 1.0    # "grouped_topk": the routed experts' weight scale
    experts: str = "swiglu"          # components.experts.EXPERTS
    mixers: tuple = ()               # per layer "attention" | "deltanet" (); () all attention
    deltanet_key_heads: int = 0      # Gated DeltaNet layers (components.deltanet): q/k heads,
    deltanet_value_heads: int = 0    # value heads (each q/k head serves value/key of them),
    deltanet_key_dim: int = 0        # head widths, the causal conv's kernel and the chunk
    deltanet_value_dim: int = 0      # of the chunked delta rule (the forward's, not the
    deltanet_conv_kernel: int = 4    # checkpoint's: any chunk computes the same function)
    deltanet_chunk: int = 64
    norm_offset: float = 0.0         # RMSNorm gain offset + w: 1 for Qwen3-Next's (1 + w)
    attn_output_gate: bool = False   # attention output times sigmoid(x W_gate) (Qwen3-Next)
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: str = "none"
    clip_qkv: Optional[float] = None  # OLMoE: clamp q, k, v to [-clip, clip] after the norms
    sliding_window: int = 0          # "gqa_sinks", "gqa": keys < sliding_window positions back
    sliding_layers: tuple = ()       # are seen in these layers (layer_config); 0: every key
    global_layer: tuple = ()         # Gemma-4: ((field, value), ..) the non-sliding layers' own
    #                                  GLOBAL_LAYER_FIELDS (head_dim, KV heads, rope, K = V)
    v_norm: bool = False             # Gemma-4: a gain-less RMSNorm of each value head
    k_eq_v: bool = False             # Gemma-4 full layers: values = the key projection (no v)
    attention_scale: float = 0.0     # the attention logits' factor (0: head_dim^-1/2; Gemma-4: 1)
    hidden_act: str = "silu"         # the dense MLPs' gate activation (experts.ACTIVATIONS)
    layer_form: str = "pre_norm"     # LAYER_FORMS: "gemma4" (sandwich norms, MLP beside MoE)
    embed_scale: bool = False        # Gemma: the embeddings times sqrt(hidden_size)
    final_logit_softcap: float = 0.0  # Gemma: logits = cap tanh(logits / cap); 0: none
    tie_word_embeddings: bool = False
    moe_layers: tuple = ()           # indices of the MoE layers; the others are dense
    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False     # renormalise the k selected probabilities to sum 1
    shared_expert_size: int = 0      # an always-on expert (Qwen2-MoE, DeepSeek's shared ones)
    shared_expert_gate: bool = True  # Qwen2-MoE: behind a sigmoid gate (a coefficient)
    swiglu_limit: float = 7.0        # "clamped_swiglu": gate <= limit, |up| <= limit
    swiglu_alpha: float = 1.702      # "clamped_swiglu": gate * sigmoid(alpha * gate)
    moe_dispatch: str = "dropless"   # "dropless": sort by expert (dispatch.dropless);
    #                                  "dense": every expert on every token (E/k x the FLOPs)
    moe_load_balance_loss_weight: float = 0.0  # training: Switch load balance (moe_ffn),
    #                                  the moe family's knob (was router_aux_loss_coef)
    router_bias_rate: float = 0.0    # training: DeepSeek-V3's aux-loss-free bias step u
    residual: str = "plain"          # RESIDUALS: "hyper" = mHC with hc streams (DeepSeek-V4)
    hc: int = 4                      # "hyper": residual streams per token
    hc_sinkhorn_iters: int = 20      # "hyper": Sinkhorn rounds making comb doubly stochastic
    mod_layers: tuple = ()           # Mixture-of-Depths layers (disjoint from moe_layers)
    mod_capacity: float = 0.125      # c: a MoD layer runs k = floor(c T) tokens (top-k)
    mod_route: str = "topk"          # "topk" (training) | causal: "router" | "predictor"
    mod_router_weight: str = "sigmoid"  # the update's multiplier: sigmoid(r) or "raw" r
    mod_bce_weight: float = 0.01     # aux BCE: the router logit learns top-k membership
    mod_predictor_weight: float = 0.01  # aux BCE: the predictor learns it (stop-gradient)
    mod_predictor_hidden: int = 32
    attn_block: int = 128            # causal_attention's query blocks (0: the full square)
    remat: bool = False              # rematerialise each layer in a backward pass (plan, tuning)
    dtype: str = "float32"           # parameter and compute dtype

    def __post_init__(self):
        object.__setattr__(self, "moe_layers", tuple(int(i) for i in self.moe_layers))
        object.__setattr__(self, "mod_layers", tuple(int(i) for i in self.mod_layers))
        object.__setattr__(self, "sliding_layers", tuple(int(i) for i in self.sliding_layers))
        object.__setattr__(self, "index_shared", tuple(int(i) for i in self.index_shared))
        object.__setattr__(self, "mixers", tuple(self.mixers))
        object.__setattr__(self, "global_layer", tuple((str(k), v) for k, v in self.global_layer))
        checks = [
            (self.n_heads % self.n_kv_heads == 0,
             f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}"),
            (rotary_lib.rope_dim(self) % 2 == 0,
             f"head_dim={self.head_dim} x partial_rotary_factor={self.partial_rotary_factor} "
             "must be even (rotary)"),
            (self.qk_norm in QK_NORMS, f"qk_norm={self.qk_norm!r}; use one of {QK_NORMS}"),
            (self.rope_type in ROPE_TYPES,
             f"rope_type={self.rope_type!r}; use one of {ROPE_TYPES}"),
            (self.attention in ATTENTION,
             f"attention={self.attention!r}; use one of {tuple(ATTENTION)}"),
            (self.router in ROUTERS, f"router={self.router!r}; use one of {tuple(ROUTERS)}"),
            (self.router_score in ("softmax", "sigmoid"),
             f"router_score={self.router_score!r}; use 'softmax' or 'sigmoid'"),
            (self.router_group_score in ("top2_sum", "max"),
             f"router_group_score={self.router_group_score!r}; use 'top2_sum' or 'max'"),
            (not self.moe_layers or (self.num_experts % self.n_group == 0
                                     and 1 <= self.topk_group <= self.n_group),
             f"n_group={self.n_group} must divide num_experts={self.num_experts} and "
             f"topk_group={self.topk_group} lie in 1..n_group"),
            (self.experts in EXPERTS, f"experts={self.experts!r}; use one of {tuple(EXPERTS)}"),
            (self.hidden_act in ACTIVATIONS,
             f"hidden_act={self.hidden_act!r}; use one of {tuple(ACTIVATIONS)}"),
            (self.layer_form in LAYER_FORMS and (self.layer_form == "pre_norm" or (
                self.residual == "plain" and not self.mod_layers and not self.index_topk)),
             f"layer_form={self.layer_form!r} must be one of {LAYER_FORMS}; 'gemma4' needs "
             "residual='plain', no mod_layers and no indexer"),
            (all(k in GLOBAL_LAYER_FIELDS for k, _ in self.global_layer),
             f"global_layer={self.global_layer} may set only {GLOBAL_LAYER_FIELDS}"),
            (not (self.k_eq_v or self.v_norm) or self.attention in ("gqa", "gqa_sinks"),
             "k_eq_v and v_norm are grouped-query attention's (attention='gqa')"),
            (self.dtype in ("float32", "bfloat16"),
             f"dtype={self.dtype!r}; use 'float32' or 'bfloat16'"),
            (all(0 <= i < self.n_layers for i in self.moe_layers),
             f"moe_layers={self.moe_layers} must lie in 0..{self.n_layers - 1}"),
            (not self.moe_layers or 1 <= self.top_k <= self.num_experts,
             f"top_k={self.top_k} must be in 1..num_experts={self.num_experts}"),
            (not self.mixers or (len(self.mixers) == self.n_layers
                                 and set(self.mixers) <= set(MIXERS)),
             f"mixers={self.mixers} must name one of {MIXERS} for each of the {self.n_layers} "
             "layers (or be empty: all attention)"),
            (not set(self.deltanet_layers) & set(self.mod_layers),
             f"mod_layers={self.mod_layers} include Gated DeltaNet layers; MoD routes "
             "attention layers only"),
            (self.router_bias_rate >= 0 and (not self.router_bias_rate or (
                self.router == "grouped_topk" and self.router_bias)),
             f"router_bias_rate={self.router_bias_rate} must be >= 0, and > 0 only with "
             "router='grouped_topk' and router_bias=True (the bias it moves)"),
            (self.router != "hash" or not self.mod_layers,
             "router='hash' reads token ids, which Mixture-of-Depths layers do not carry; "
             "drop mod_layers or choose another router"),
            (self.residual in RESIDUALS and (self.residual == "plain" or (
                self.hc >= 1 and not self.mod_layers and not self.index_topk)),
             f"residual={self.residual!r} must be one of {RESIDUALS}; 'hyper' needs hc >= 1 "
             f"(hc={self.hc}) and no mod_layers or sparse-attention indexer"),
            (self.moe_dispatch in MOE_DISPATCHES,
             f"moe_dispatch={self.moe_dispatch!r}; use one of {MOE_DISPATCHES}"),
            (all(0 <= i < self.n_layers for i in self.mod_layers)
             and len(set(self.mod_layers)) == len(self.mod_layers),
             f"mod_layers={self.mod_layers} must be distinct layers in 0..{self.n_layers - 1}"),
            (not set(self.mod_layers) & set(self.moe_layers),
             f"mod_layers={self.mod_layers} and moe_layers={self.moe_layers} share a layer; "
             "a MoD layer's FFN is its dense MLP"),
            (0 < self.mod_capacity <= 1, f"mod_capacity={self.mod_capacity} must be in (0, 1]"),
            (self.mod_route in MOD_ROUTES, f"mod_route={self.mod_route!r}; use one of {MOD_ROUTES}"),
            (self.mod_router_weight in ("raw", "sigmoid"),
             f"mod_router_weight={self.mod_router_weight!r}; use 'raw' or 'sigmoid'"),
            (not self.index_topk or (self.attention == "mla" and self.q_lora_rank
                                     and 0 not in self.index_shared and not self.mod_layers),
             "an indexer (index_topk > 0) needs attention='mla' with q_lora_rank, no MoD "
             "layers, and layer 0 indexing (index_shared may not hold 0)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"llm config: {message}")

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def deltanet_layers(self) -> tuple:
        return tuple(i for i, m in enumerate(self.mixers) if m == "deltanet")

    @property
    def attention_layers(self) -> tuple:
        return tuple(i for i in range(self.n_layers) if i not in self.deltanet_layers)

    @property
    def deltanet(self) -> deltanet.Dims:
        """The Gated DeltaNet layers' sizes as ``components.deltanet`` reads them."""
        return deltanet.Dims(self.hidden_size, self.deltanet_key_heads,
                             self.deltanet_value_heads, self.deltanet_key_dim,
                             self.deltanet_value_dim, self.deltanet_conv_kernel,
                             self.rms_norm_eps, self.deltanet_chunk)

    @property
    def hyper(self) -> hyper.Dims:
        """The hyper-connections' settings as ``components.hyper`` reads them."""
        return hyper.Dims(self.hidden_size, self.hc, self.hc_sinkhorn_iters, 1e-6,
                          self.rms_norm_eps)

    @property
    def variant(self) -> str:
        """What the layers route: "dense", "moe", "mod" or "mod+moe" (run names, records)."""
        kinds = [k for k, on in (("mod", self.mod_layers), ("moe", self.moe_layers)) if on]
        return "+".join(kinds) or "dense"

    @property
    def mod(self) -> ModConfig:
        """The MoD fields as ``dynjax.models.mod`` reads them (``cfg.mod.capacity``, ...)."""
        return ModConfig(capacity=self.mod_capacity, layers=self.mod_layers,
                         router_weight=self.mod_router_weight, route=self.mod_route,
                         bce_weight=self.mod_bce_weight,
                         predictor_weight=self.mod_predictor_weight,
                         predictor_hidden=self.mod_predictor_hidden)


def schema(cfg: Config):
    """Router scores for the MoE layers; Qwen2-MoE's shared-expert gates; MoD router (and
    predictor) logits for the MoD layers; the Gated DeltaNet layers' beta and log decay
    (layer, example, token, head); the attention output gates sigmoid(x W_gate) (layer,
    example, token, head, unit); none if dense. Each leaf stacks the layers that have it."""
    out = {}
    if cfg.deltanet_layers:
        out.update(deltanet.SCHEMA)
    if cfg.attn_output_gate and cfg.attention_layers:
        out["attn_gate"] = ATTN_GATE_AXES
    if cfg.moe_layers:
        out["router"] = ROUTER_AXES
    if cfg.moe_layers and cfg.shared_expert_size and cfg.shared_expert_gate:
        out["shared_gate"] = SHARED_GATE_AXES
    if cfg.mod_layers:
        out["mod_router"] = MOD_AXES
    if cfg.mod_layers and cfg.mod_route == "predictor":
        out["mod_predictor"] = MOD_AXES
    if cfg.index_topk:
        out["indexer"] = indexer_lib.AXES
    if cfg.residual == "hyper":
        mhc = {"pre": hyper.PRE_AXES, "post": hyper.PRE_AXES, "comb": hyper.COMB_AXES}
        out.update(mhc_attn=dict(mhc), mhc_ffn=dict(mhc), mhc_head={"pre": hyper.HEAD_AXES})
    return out


def eval_routes(cfg: Config) -> dict:
    """name -> (config, causal?): a MoD model is scored under top-k (the training rule; it
    sees the whole window, so non-causal) and both causal rules; otherwise the forward."""
    if not cfg.mod_layers:
        return {"forward": (cfg, True)}
    return {route: (dataclasses.replace(cfg, mod_route=route), route != "topk")
            for route in MOD_ROUTES}


# --------------------------------------------------------------------------------------------
# Parameters: one table drives init, logical axes and checkpoint loading
# --------------------------------------------------------------------------------------------

def param_table(cfg: Config):
    """(path, shape, logical axes) of every parameter, in checkpoint order."""
    D = cfg.hidden_size
    rows = [(("embed",), (cfg.vocab_size, D), ("vocab", "embed"))]
    for i in range(cfg.n_layers):
        L = ("layers", i)
        rows.append((L + ("input_norm",), (D,), ("embed",)))
        if i in cfg.deltanet_layers:
            rows += deltanet.param_rows(cfg.deltanet, L + ("deltanet",))
        else:
            lc = layer_config(cfg, i)   # Gemma-4's full layers: their own heads
            rows += ATTENTION[cfg.attention].rows(lc, L + ("attn",))
            if cfg.attn_output_gate:
                rows.append((L + ("attn", "gate"), (D, cfg.n_heads, cfg.head_dim),
                             ("embed", "heads", "kv")))
        if cfg.index_topk and i not in cfg.index_shared:
            rows += indexer_lib.rows(L + ("attn", "indexer"), D, cfg.q_lora_rank,
                                     cfg.index_n_heads, cfg.index_head_dim)
        gemma = cfg.layer_form == "gemma4"
        if gemma:
            rows.append((L + ("attn_out_norm",), (D,), ("embed",)))
        rows.append((L + ("post_norm",), (D,), ("embed",)))
        if i in cfg.mod_layers:   # named as mod.Router's and mod.Predictor's parameters
            hid = cfg.mod_predictor_hidden
            rows += [(L + ("router", "proj", "kernel"), (D, 1), ("embed", None)),
                     (L + ("predictor", "hidden", "kernel"), (D, hid), ("embed", None)),
                     (L + ("predictor", "hidden", "bias"), (hid,), (None,)),
                     (L + ("predictor", "out", "kernel"), (hid, 1), (None, None)),
                     (L + ("predictor", "out", "bias"), (1,), (None,))]
        if i in cfg.moe_layers:
            M = L + ("moe",)
            rows += ROUTERS[cfg.router].rows(cfg, M)
            rows += EXPERTS[cfg.experts].rows(M + ("experts",), D, cfg.moe_intermediate_size,
                                              cfg.num_experts)
            if cfg.shared_expert_size:
                rows += mlp_rows(M + ("shared",), D, cfg.shared_expert_size)
                if cfg.shared_expert_gate:
                    rows.append((M + ("shared_gate",), (D, 1), ("embed", None)))
            if gemma:   # the experts' own input and output norms, the MLP's output norm
                rows += [(M + ("in_norm",), (D,), ("embed",)),
                         (M + ("out_norm",), (D,), ("embed",)),
                         (L + ("mlp_out_norm",), (D,), ("embed",))]
        if i not in cfg.moe_layers or gemma:
            rows += mlp_rows(L + ("mlp",), D, cfg.intermediate_size)
        if gemma:
            rows += [(L + ("ffn_out_norm",), (D,), ("embed",)),
                     (L + ("layer_scalar",), (1,), (None,))]
        if cfg.residual == "hyper":
            rows += hyper.rows(cfg.hyper, L + ("attn_hc",)) + hyper.rows(cfg.hyper, L + ("ffn_hc",))
    if cfg.residual == "hyper":
        rows += hyper.head_rows(cfg.hyper, ("hc_head",))
    rows.append((("final_norm",), (D,), ("embed",)))
    if not cfg.tie_word_embeddings:
        rows.append((("lm_head",), (D, cfg.vocab_size), ("embed", "vocab")))
    return rows


def params_from_table(cfg: Config, leaf):
    """The params pytree with ``leaf(path, shape)`` at every :func:`param_table` row."""
    return table.tree(param_table(cfg), leaf)


def param_dtype(cfg: Config, path) -> str:
    """The dtype a parameter is kept in: ``cfg.dtype``, except what the router keeps in
    float32 whatever the model's dtype (DeepSeek's gate weight and bias: transformers
    keeps them so, and in bfloat16 they would move the selection)."""
    if "moe" in path and path[-1] in ROUTERS[cfg.router].float32_params:
        return "float32"
    return cfg.dtype


# parameters that start at 1: Gemma-4's layer scalar and router scales
ONES = ("layer_scalar", "router_scale", "expert_scale")


def init(cfg: Config, key):
    """Fresh parameters: weights N(0, 0.02), norm gains 1 (w = 1 - norm_offset), biases 0,
    scales (:data:`ONES`) 1."""
    def leaf(path, shape):
        name, dt = path[-1], param_dtype(cfg, path)
        if name.endswith("norm"):   # the DeltaNet output norm's gain is w itself
            offset = 0.0 if "deltanet" in path else cfg.norm_offset
            return jnp.full(shape, 1.0 - offset, dt)
        if name in ONES:
            return jnp.ones(shape, dt)
        if name.endswith("bias"):
            return jnp.zeros(shape, dt)
        k = jax.random.fold_in(key, zlib.crc32("/".join(map(str, path)).encode()))
        if name == "tid2eid":
            return routers_lib.hash_table(k, *shape[:1], cfg.num_experts, shape[1]).astype(dt)
        return (0.02 * jax.random.normal(k, shape)).astype(dt)
    return params_from_table(cfg, leaf)


def logical_axes(cfg: Config):
    """Logical axis names of every parameter (a pytree of PartitionSpec)."""
    return params_from_table(cfg, lambda path, _: P(*dict(
        (p, a) for p, _, a in param_table(cfg))[path]))


# --------------------------------------------------------------------------------------------
# Forward pass
# --------------------------------------------------------------------------------------------

def inv_frequencies(cfg: Config) -> np.ndarray:
    """Rotary inverse frequencies (``components.rotary``)."""
    return rotary_lib.inv_frequencies(cfg)


def positions_at(cfg: Config, index) -> Positions:
    """The core's :class:`Positions` of tokens at integer positions ``index`` (B, T)."""
    return rotary_lib.positions_at(cfg, index)


def project_qkv(cfg: Config, p, x, positions: Positions):
    """Queries and the cached keys and values of x (B, T, D): ``cfg.attention``'s."""
    return ATTENTION[cfg.attention].project(cfg, p, x, positions)


def attend(cfg: Config, p, q, k, v, q_pos, k_pos, gate=None):
    """Causal attention of q over k, v and the output projection (B, Tq, D); ``gate``
    (B, Tq, H, head_dim) multiplies each head's output before the projection."""
    return ATTENTION[cfg.attention].attend(cfg, p, q, k, v, q_pos, k_pos, gate)


def norm(cfg: Config, x, w):
    """The model's RMSNorm (gain ``norm_offset + w``)."""
    return rms_norm(x, w, cfg.rms_norm_eps, offset=cfg.norm_offset)


def _pick(given, names):
    """The part of a layer's ``given`` coefficients one site reads."""
    return coeffs_lib.part(given, lambda v: {n: v[n] for n in names})


def token_mixer(cfg: Config, p, x, positions: Positions, given, state=None):
    """The layer's token mixer on the normed x (B, T, D): (update, its coefficients after
    their site, the new decoding state). A Gated DeltaNet layer continues from ``state``
    (``components.deltanet.State``; None: the sequence starts here). An attention layer
    attends within the chunk; its output gate sigmoid(x W_gate) (Qwen3-Next) is a site."""
    if "deltanet" in p:
        return deltanet.mix(cfg.deltanet, p["deltanet"], x,
                            _pick(given, tuple(deltanet.SCHEMA)), state)
    q, k, v = project_qkv(cfg, p["attn"], x, positions)
    gate, used = output_gate(cfg, p["attn"], x, given)
    return attend(cfg, p["attn"], q, k, v, positions.index, positions.index, gate), used, None


def output_gate(cfg: Config, p, x, given):
    """(sigmoid(x W_gate) (B, T, H, head_dim) after its site, {"attn_gate": it}), or
    (None, {}) where the attention has no output gate."""
    if not cfg.attn_output_gate:
        return None, {}
    computed = jax.nn.sigmoid(matmul.einsum("btd,dhk->bthk", x, p["gate"].astype(x.dtype)))
    used = coeffs_lib.site({"attn_gate": computed.astype(F32)}, _pick(given, ("attn_gate",)))
    return used["attn_gate"], used


def route(cfg: Config, scores, p=None, tokens=None):
    """Top-k experts (.., k) and their float32 weights from the router scores, by
    ``cfg.router``'s rule (``p``: the layer's MoE params, for rules with a bias or a table;
    ``tokens`` (..): the token ids, for the hash router)."""
    return ROUTERS[cfg.router].select(cfg, p, scores, tokens)


def selected_experts(cfg: Config, params, router, tokens=None):
    """The experts (moe layer, ..., k) each MoE layer's router picks from the scores
    ``router`` (moe layer, ..., E): its own rule, with the layer's bias and groups (a hash
    router: its table's experts of ``tokens``)."""
    moe = [p["moe"] for p in params["layers"] if "moe" in p]
    return jnp.stack([route(cfg, s, p, tokens)[0] for s, p in zip(router, moe)])


def after_update(cfg: Config, old, new, router, tokens=None):
    """The training rules outside the gradient, after an optimizer step from params ``old``
    to ``new``: each MoE layer's parameters its router keeps fixed (a hash table) are the
    old ones, and a selection bias moves one auxiliary-loss-free step from its old value
    (``routers.bias_update``, rate ``router_bias_rate``) by the loads its rule gave the
    step's scores ``router`` (moe layer, example, token, E). A no-op for other models."""
    frozen = getattr(ROUTERS[cfg.router], "frozen", ())
    if not cfg.moe_layers or not (frozen or cfg.router_bias_rate):
        return new
    experts = selected_experts(cfg, old, router, tokens) if cfg.router_bias_rate else None
    layers, j = [], 0
    for p_old, p in zip(old["layers"], new["layers"]):
        if "moe" in p:
            moe = {**p["moe"], **{n: p_old["moe"][n] for n in frozen}}
            if cfg.router_bias_rate:
                bias = p_old["moe"]["router_bias"]
                moe["router_bias"] = routers_lib.bias_update(
                    bias, experts[j], cfg.num_experts, cfg.router_bias_rate).astype(bias.dtype)
            p, j = {**p, "moe": moe}, j + 1
        layers.append(p)
    return {**new, "layers": layers}


def moe_ffn(cfg: Config, p, x, given, tokens=None, router_x=None):
    """The shared ``moe_ffn.moe_ffn`` behind this family's routers, shared expert and gate:
    x (B, T, D) -> (y, {"router": probs (B, T, E)[, "shared_gate": (B, T)]}, aux), the
    coefficients after their site: the router always runs, ``given`` decides. ``aux``: the
    weighted load-balancing loss when ``moe_load_balance_loss_weight`` > 0 (training).
    ``tokens`` (B, T): the token ids (a hash router's selection). ``router_x``: what the
    router reads where it is not x (Gemma-4: the residual stream)."""
    B, T, D = x.shape
    dt = cfg.compute_dtype
    computed = {"router": ROUTERS[cfg.router].scores(cfg, p, x if router_x is None
                                                       else router_x)}
    gated = cfg.shared_expert_size and cfg.shared_expert_gate
    if gated:
        computed["shared_gate"] = jax.nn.sigmoid(x @ p["shared_gate"].astype(dt))[..., 0] \
            .astype(F32)
    used = coeffs_lib.site(computed, _pick(given, tuple(computed)))
    experts, weights = route(cfg, used["router"], p, tokens)
    y, _ = moe_ffn_lib.moe_ffn(x, used["router"], experts, weights, p["experts"],
                               kind=EXPERTS[cfg.experts](cfg), num_experts=cfg.num_experts,
                               dispatch=cfg.moe_dispatch, capacity=T, dtype=dt)
    if gated:
        y = y + used["shared_gate"].astype(dt)[..., None] * swiglu(p["shared"], x, dt)
    elif cfg.shared_expert_size:
        y = y + swiglu(p["shared"], x, dt)
    aux = {"load_balance": moe_ffn_lib.load_balance(used["router"], experts,
                                                    cfg.moe_load_balance_loss_weight)} \
        if cfg.moe_load_balance_loss_weight else {}
    return y, used, aux


def _layer_given(given, names, j):
    """Layer j's slice of the coefficients ``names``."""
    return coeffs_lib.part(given, lambda v: {name: v[name][j] for name in names})


def layer_coefficients(cfg: Config, i: int) -> tuple:
    """The coefficient names layer i records (its rows of each leaf in :func:`schema`)."""
    names = []
    if i in cfg.deltanet_layers:
        names += list(deltanet.SCHEMA)
    elif cfg.attn_output_gate:
        names.append("attn_gate")
    if i in cfg.mod_layers:
        names += [n for n in ("mod_router", "mod_predictor") if n in schema(cfg)]
    if i in cfg.moe_layers:
        names += [n for n in ("router", "shared_gate") if n in schema(cfg)]
    if cfg.residual == "hyper":
        names += ["mhc_attn", "mhc_ffn"]
    return tuple(names)


def ffn(cfg: Config, p, x, given, tokens=None):
    """The layer's FFN on the normed x: (m, its coefficients after their site ({} if
    dense), aux losses); ``tokens``: the token ids (a hash router's)."""
    if "moe" in p:
        return moe_ffn(cfg, p["moe"], x, given, tokens)
    return swiglu(p["mlp"], x, cfg.compute_dtype, cfg.hidden_act), {}, {}


def feed_forward(cfg: Config, p, z, given, tokens=None):
    """The FFN update of the residual stream z (B, T, D): FFN(RMS z) (:func:`ffn`) or, in
    the "gemma4" layer form, RMS_out(RMS_1(MLP(RMS z)) [+ RMS_2(MoE(RMS_in z))]) with the
    router reading z itself. (m, coefficients after their sites, aux losses)."""
    x = norm(cfg, z, p["post_norm"])
    if cfg.layer_form != "gemma4":
        return ffn(cfg, p, x, given, tokens)
    m = swiglu(p["mlp"], x, cfg.compute_dtype, cfg.hidden_act)
    used, aux = {}, {}
    if "moe" in p:
        y, used, aux = moe_ffn(cfg, p["moe"], norm(cfg, z, p["moe"]["in_norm"]), given,
                               tokens, router_x=z)
        m = norm(cfg, m, p["mlp_out_norm"]) + norm(cfg, y, p["moe"]["out_norm"])
    return norm(cfg, m, p["ffn_out_norm"]), used, aux


def mixer_update(cfg: Config, p, a):
    """The token mixer's output as added to the residual (normed in the "gemma4" form)."""
    return norm(cfg, a, p["attn_out_norm"]) if cfg.layer_form == "gemma4" else a


def layer_output(cfg: Config, p, h):
    """The layer's new residual stream (times its learned scalar in the "gemma4" form)."""
    return h * p["layer_scalar"].astype(h.dtype) if cfg.layer_form == "gemma4" else h


def index_keys(cfg: Config, p, x, positions: Positions):
    """The layer's lightning-indexer keys (B, T, d) of the normed x (B, T, D)."""
    return indexer_lib.keys(p["indexer"], x, positions.cos, positions.sin,
                            cfg.index_rope_interleave)


def sparse_attention(cfg: Config, p, x, q, k, v, positions: Positions, index, keys=None):
    """DeepSeek Sparse Attention: the layer's own lightning indexer scores (a coefficient
    site; ``index`` = (its Given, the previous layer's selection)) or the previous indexing
    layer's selection (GLM-5's shared layers) pick each query's keys; (a, {"indexer"} or {},
    the selection (B, T, S)). ``keys`` (decoding): (the indexer keys (B, S, d) or None, the
    positions (B, S)) of the slots k and v hold; default the chunk's own (the forward)."""
    given, chosen = index
    used = {}
    if "indexer" in p:
        q_res = rms_norm(matmul.mm(x, p["q_a"].astype(x.dtype)), p["q_a_norm"], LATENT_NORM_EPS)
        iq, w = indexer_lib.query(p["indexer"], x, q_res, positions.cos, positions.sin,
                                  cfg.index_rope_interleave)
        ik, k_pos = keys or (index_keys(cfg, p, x, positions), positions.index)
        used = coeffs_lib.site({"indexer": indexer_lib.score(iq, w, ik)}, given)
        visible = k_pos[:, None, :] <= positions.index[:, :, None]
        chosen = indexer_lib.select(used["indexer"], visible, cfg.index_topk)
    out = indexer_lib.attend_selected(q, k, v, chosen, ATTENTION[cfg.attention].scale(cfg))
    return matmul.einsum("bthk,hkd->btd", out, p["o"].astype(cfg.compute_dtype)), used, chosen


def attention_then_ffn(cfg: Config, p, h, positions: Positions, given, index=None,
                       tokens=None):
    """A layer's two updates, pre-norm: a = Mixer(RMS h), then m = FFN(RMS(h + a)).
    Returns (a, m, the layer's coefficients after their sites ({} if none), aux losses);
    with ``index`` (an indexer model) also (its indexer coefficients, its selection).
    ``tokens`` (B, T): the token ids (a hash router's)."""
    x_in = norm(cfg, h, p["input_norm"])
    if index is not None:
        q, k, v = project_qkv(cfg, p["attn"], x_in, positions)
        a, index_used, chosen = sparse_attention(cfg, p["attn"], x_in, q, k, v, positions, index)
        return (a, *ffn(cfg, p, norm(cfg, h + a, p["post_norm"]), given), (index_used, chosen))
    a, used, _ = token_mixer(cfg, p, x_in, positions, given)
    a = mixer_update(cfg, p, a)
    m, used_ffn, aux = feed_forward(cfg, p, h + a, given, tokens)
    return a, m, {**used, **used_ffn}, aux


def hyper_layer(cfg: Config, p, h, positions: Positions, given, tokens=None):
    """A layer on hc residual streams h (B, T, hc, D): the mixer, then the FFN, each behind
    its hyper-connection (``components.hyper.around``: pre collapses the streams into the
    block's input, post and comb write them back). (new h, coefficients after their sites
    (``mhc_attn``, ``mhc_ffn`` and the blocks' own), aux losses)."""
    used, aux = {}, {}

    def mixer(z):
        a, c, _ = token_mixer(cfg, p, norm(cfg, z, p["input_norm"]), positions, given)
        used.update(c)
        return a

    def ffn_block(z):
        m, c, a = feed_forward(cfg, p, z, given, tokens)
        used.update(c)
        aux.update(a)
        return m
    h, used["mhc_attn"] = hyper.around(cfg.hyper, p["attn_hc"], h, mixer,
                                       _pick_tree(given, "mhc_attn"))
    h, used["mhc_ffn"] = hyper.around(cfg.hyper, p["ffn_hc"], h, ffn_block,
                                      _pick_tree(given, "mhc_ffn"))
    return h, used, aux


def _pick_tree(given, name):
    """The given values of one nested coefficient family (a dict of leaves)."""
    return coeffs_lib.part(given, lambda v: v[name])


def mod_layer(cfg: Config, p, h, positions: Positions, given):
    """A Mixture-of-Depths layer: (new h, {"mod_router"[, "mod_predictor"]}, BCE losses).

    ``mod.choose_slots`` picks the tokens (top-k of the router's scores, or the causal
    rule's askers) and ``mod.routed_update`` runs the whole layer on them alone (they attend
    among themselves at their original positions), adding weight(r) * (a + m) to each; the
    other tokens pass unchanged. The predictor always runs (its BCE trains it)."""
    pred = mod_lib.Predictor(cfg.mod_predictor_hidden).apply({"params": p["predictor"]}, h)
    computed = {"mod_router": mod_lib.Router().apply({"params": p["router"]}, h)}
    if cfg.mod_route == "predictor":
        computed["mod_predictor"] = pred
    used = coeffs_lib.site(computed, _pick(given, tuple(computed)))
    scores = used["mod_router"]
    idx, valid, top_idx, top_valid, _ = mod_lib.choose_slots(
        cfg, scores, used.get("mod_predictor", scores))

    def update(x, routed: Positions):
        a, m, _, _ = attention_then_ffn(cfg, p, x, routed, None)
        return a + m, None
    h, _ = mod_lib.routed_update(update, h, positions, scores, idx, valid,
                                 lambda r: mod_lib.router_weight(cfg, r))
    _, aux = mod_lib.routing_losses(cfg, scores, pred, top_idx, top_valid)
    return h, used, aux


def layer(cfg: Config, p, h, positions: Positions, given, index=None, tokens=None):
    """One pre-norm layer: (new h, its coefficients after their site ({} if dense), its
    auxiliary training losses ({} for the ports' own layers)); with ``index`` (an indexer
    model: :func:`sparse_attention`) also (its indexer coefficients, its selection).
    ``tokens`` (B, T): the token ids (a hash router's); h is (B, T, hc, D) streams under
    ``residual`` "hyper" (:func:`hyper_layer`)."""
    if "router" in p:
        return mod_layer(cfg, p, h, positions, given)
    if cfg.residual == "hyper":
        return hyper_layer(cfg, p, h, positions, given, tokens)
    if index is not None:
        a, m, used, aux, selected = attention_then_ffn(cfg, p, h, positions, given, index)
        return h + a + m, used, aux, selected
    a, m, used, aux = attention_then_ffn(cfg, p, h, positions, given, tokens=tokens)
    h = h + a
    return layer_output(cfg, p, h + m), used, aux


@functools.lru_cache(maxsize=None)
def layer_config(cfg: Config, i: int) -> Config:
    """The config layer ``i`` computes with: ``sliding_window`` only in ``sliding_layers``;
    the other layers take ``global_layer``'s fields (Gemma-4's full-attention layers)."""
    if i in cfg.sliding_layers or not (cfg.sliding_window or cfg.global_layer):
        return cfg
    return dataclasses.replace(cfg, sliding_window=0, global_layer=(), **dict(cfg.global_layer))


def layer_positions(cfg: Config, i: int, positions: Positions) -> Positions:
    """Layer i's rotary positions: the model's, or its own where ``global_layer`` gives it
    another rotary (Gemma-4's full-attention layers)."""
    if not cfg.global_layer or i in cfg.sliding_layers:
        return positions
    return positions_at(layer_config(cfg, i), positions.index)


def embed(cfg: Config, params, tokens):
    """The tokens' embeddings (B, T, D) in the compute dtype (times sqrt(D): ``embed_scale``,
    the factor rounded to the dtype as transformers rounds it)."""
    h = jnp.take(params["embed"], tokens, axis=0).astype(cfg.compute_dtype)
    if cfg.embed_scale:
        h = h * jnp.asarray(np.float32(cfg.hidden_size ** 0.5), cfg.compute_dtype)
    return h


def _forward(cfg: Config, params, tokens, coeffs=None):
    """``(logits, coeffs, aux)``: each auxiliary loss is its mean over the layers with it."""
    given = coeffs_lib.as_given(coeffs)
    B, T = tokens.shape
    positions = positions_at(cfg, jnp.broadcast_to(jnp.arange(T), (B, T)))
    h = embed(cfg, params, tokens)
    if cfg.residual == "hyper":
        h = hyper.expand_embeddings(cfg.hyper, h)
    run = jax.checkpoint(layer, static_argnums=0) if cfg.remat else layer
    used, aux = {}, {}
    chosen = None
    for i, p in enumerate(params["layers"]):
        names = layer_coefficients(cfg, i)
        rows = {n: len(used.get(n, ())) for n in names}   # this layer's row of each leaf
        layer_given = coeffs_lib.part(given, lambda v: {
            n: jax.tree.map(lambda a: a[rows[n]], v[n]) for n in names}) if names else None
        if cfg.index_topk:
            index = (_layer_given(given, ["indexer"], len(used.get("indexer", ())))
                     if "indexer" in p["attn"] else None, chosen)
            h, c, a, (index_used, chosen) = run(layer_config(cfg, i), p, h, positions,
                                                layer_given, index)
            if index_used:
                used.setdefault("indexer", []).append(index_used["indexer"])
        else:
            h, c, a = run(layer_config(cfg, i), p, h, layer_positions(cfg, i, positions),
                          layer_given, None, tokens)
        for name in names:
            used.setdefault(name, []).append(c[name])
        for name, value in a.items():
            aux.setdefault(name, []).append(value)
    coeffs = {name: jax.tree.map(lambda *a: jnp.stack(a), *rows) for name, rows in used.items()}
    if cfg.residual == "hyper":
        h, coeffs["mhc_head"] = hyper.head(cfg.hyper, params["hc_head"], h,
                                           _pick_tree(given, "mhc_head"))
    logits = head(cfg, params, norm(cfg, h, params["final_norm"]))
    return logits, coeffs, {name: jnp.mean(jnp.stack(v)) for name, v in aux.items()}


def forward(cfg: Config, params, tokens, coeffs=None):
    """``(logits float32 (B, T, V), coeffs)``; ``coeffs``: None records, a pytree replays,
    a :class:`~dynjax.coeffs.Given` is either."""
    logits, used, _ = _forward(cfg, params, tokens, coeffs)
    return logits, used


def head(cfg: Config, params, x):
    """Float32 logits of the final-normed hidden states (the embedding when tied), soft-capped
    to (-cap, cap) by cap tanh(z / cap) where ``final_logit_softcap`` is set (Gemma)."""
    w = params["embed"].T if cfg.tie_word_embeddings else params["lm_head"]
    logits = matmul.mm(x, w.astype(x.dtype)).astype(F32)
    if cfg.final_logit_softcap:
        cap = F32(cfg.final_logit_softcap)
        logits = jnp.tanh(logits / cap) * cap
    return logits


@dataclasses.dataclass(frozen=True)
class LLM:
    """The registry's interface (``dynjax.models.build``) over the functions above; the
    parameter shapes follow from the config alone, so ``tokens`` only names the call."""

    cfg: Config

    @property
    def schema(self):
        return schema(self.cfg)

    def init(self, key, tokens=None):
        return init(self.cfg, key)

    def apply(self, params, tokens, coeffs=None, *, with_aux=False):
        """``(logits, coeffs)``, as every family; ``with_aux`` adds the auxiliary training
        losses (already weighted; the train step adds them to the loss): MoE load balance
        when ``moe_load_balance_loss_weight`` > 0, the MoD layers' router and predictor BCE; none
        for a port of a trained checkpoint."""
        given = coeffs_lib.as_given(coeffs)
        if given.values is not None:
            coeffs_lib.check(given.values, self.schema)
        logits, used, aux = _forward(self.cfg, params, tokens, given)
        return (logits, used, aux) if with_aux else (logits, used)

    def logical_axes(self, tokens=None):
        return logical_axes(self.cfg)


def param_count(cfg: Config) -> dict:
    """Total parameters and those one token uses (k routed experts per MoE layer)."""
    rows = param_table(cfg)
    total = sum(math.prod(s) for _, s, _ in rows)
    routed = sum(math.prod(s) for p, s, _ in rows if "experts" in p)
    idle = routed // max(cfg.num_experts, 1) * (cfg.num_experts - cfg.top_k)
    return {"total": total, "active": total - idle}
