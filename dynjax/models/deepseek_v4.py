"""DeepSeek-V4 (``deepseek_v4``; V4-Flash, V4-Pro) as transformers 5.25 computes it.

The residual is ``hc`` streams per token mixed around every block by manifold-constrained
hyper-connections (``components.hyper``); attention is one shared key = value head over a
sliding window plus, by layer type, heavily compressed entries (HCA) or compressed entries
an indexer selects (CSA); every layer's FFN is an MoE whose first layers route by a fixed
token-id table. Coefficients: mHC pre/post/comb, the router and hash-router scores, the
indexers' scores; record and replay are one compiled program.
Depth: docs/hf.md#the-model-step-by-step-dynjaxmodelsdeepseek_v4py
"""
from __future__ import annotations

import dataclasses
import functools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np

from dynjax import coeffs as coeffs_lib
from dynjax.coeffs import Axes
from dynjax.errors import ConfigError
from dynjax.models import dispatch
from dynjax.models.components import hyper
from dynjax.models.components import indexer as indexer_lib
from dynjax.models.components import routers
from dynjax.models.components import rotary as rotary_lib
from dynjax.models.components import table
from dynjax.models.components import attention as attention_lib
from dynjax.models.components.experts import clamped_glu, mlp_rows
from dynjax.models.components.norms import rms_norm

F32 = jnp.float32
ROUTER_AXES = Axes(("layer", "example", "token", "expert"))
INDEXER_AXES = Axes(("layer", "example", "token", "key"))
LAYER_TYPES = ("sliding_attention", "compressed_sparse_attention",
               "heavily_compressed_attention")
MLP_TYPES = ("hash_moe", "moe")


@dataclasses.dataclass(frozen=True)
class Config:
    """One DeepSeek-V4 model (hashable: a static jit argument). Defaults: transformers'."""

    model_type = "deepseek_v4"       # what dynjax.loaders.archs registers it under
    family = "deepseek_v4"           # its dynjax.models.FAMILIES entry

    vocab_size: int = 129280
    hidden_size: int = 4096
    n_heads: int = 64
    head_dim: int = 512
    rope_dim: int = 64                # qk_rope_head_dim: trailing channels that rotate
    q_lora_rank: int = 1024
    layer_types: tuple = ()
    mlp_layer_types: tuple = ()
    csa_rate: int = 4
    hca_rate: int = 128
    sliding_window: int = 128
    o_groups: int = 8
    o_lora_rank: int = 1024
    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 512
    num_experts: int = 256
    top_k: int = 6
    moe_intermediate_size: int = 2048
    routed_scaling_factor: float = 1.5
    swiglu_limit: float = 10.0
    hc: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    compress_rope: tuple = (("rope_type", "default"),)   # the "compress" rope_parameters
    tie_word_embeddings: bool = False
    dtype: str = "float32"
    remat: bool = False              # jax.checkpoint per layer (a training plan's activations)

    def __post_init__(self):
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "mlp_layer_types", tuple(self.mlp_layer_types))
        object.__setattr__(self, "compress_rope", tuple(tuple(kv) for kv in self.compress_rope))
        bad = [t for t in self.layer_types if t not in LAYER_TYPES] + \
            [t for t in self.mlp_layer_types if t not in MLP_TYPES]
        if bad:
            raise ConfigError(f"deepseek_v4: unknown layer type(s) {bad}; use {LAYER_TYPES} "
                              f"and {MLP_TYPES}")
        if len(self.layer_types) != len(self.mlp_layer_types):
            raise ConfigError(f"deepseek_v4: layer_types has {len(self.layer_types)} entries "
                              f"and mlp_layer_types {len(self.mlp_layer_types)}; give one per "
                              "layer")
        if (self.n_heads * self.head_dim) % self.o_groups:
            raise ConfigError(f"deepseek_v4: o_groups={self.o_groups} must divide n_heads x "
                              f"head_dim = {self.n_heads * self.head_dim}")

    @property
    def n_layers(self) -> int:
        return len(self.layer_types)

    @property
    def hc_dims(self) -> hyper.Dims:
        return hyper.Dims(self.hidden_size, self.hc, self.hc_sinkhorn_iters, self.hc_eps,
                          self.rms_norm_eps)

    def rope(self, kind: str):
        """The rotary settings of "main" (sliding layers, plain) or "compress" (YaRN)."""
        if kind == "main":
            return SimpleNamespace(rope_type="default", rope_theta=self.rope_theta,
                                   head_dim=self.rope_dim, partial_rotary_factor=1.0)
        p = dict(self.compress_rope)
        return SimpleNamespace(
            rope_type=p.get("rope_type", "default"), rope_theta=self.compress_rope_theta,
            head_dim=self.rope_dim, partial_rotary_factor=1.0,
            rope_factor=float(p.get("factor", 1.0)),
            rope_original_max_position=int(p.get("original_max_position_embeddings", 0) or 1),
            rope_beta_fast=float(p.get("beta_fast", 32.0)),
            rope_beta_slow=float(p.get("beta_slow", 1.0)),
            rope_truncate=bool(p.get("truncate", True)))

    @property
    def moe_layers(self) -> tuple:
        """The layers whose router is learned (top-k of scores + bias)."""
        return self.layers_of("moe")

    def layers_of(self, kind: str) -> tuple:
        table = self.mlp_layer_types if kind in MLP_TYPES else self.layer_types
        return tuple(i for i, t in enumerate(table) if t == kind)


# --------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------

def schema(cfg: Config):
    """The coefficient families (module docstring); a family with no layer is left out."""
    mhc = {"pre": hyper.PRE_AXES, "post": hyper.PRE_AXES, "comb": hyper.COMB_AXES}
    out = {"mhc_attn": dict(mhc), "mhc_ffn": dict(mhc), "mhc_head": {"pre": hyper.HEAD_AXES}}
    if cfg.layers_of("moe"):
        out["router"] = ROUTER_AXES
    if cfg.layers_of("hash_moe"):
        out["hash_router"] = ROUTER_AXES
    if cfg.layers_of("compressed_sparse_attention"):
        out["indexer"] = INDEXER_AXES
    return out


# --------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------

def _compressor_rows(path, D, dim, rate, overlap):
    width = 2 * dim if overlap else dim
    return [(path + ("kv",), (D, width), ("embed", None)),
            (path + ("gate",), (D, width), ("embed", None)),
            (path + ("position_bias",), (rate, width), (None, None)),
            (path + ("kv_norm",), (dim,), (None,))]


def param_table(cfg: Config):
    """(path, shape, logical axes) of every parameter (what :func:`params_from_tensors`
    builds): the model's shapes, shardings and counts from its config alone."""
    D, H, hd, r = cfg.hidden_size, cfg.n_heads, cfg.head_dim, cfg.q_lora_rank
    E, F = cfg.num_experts, cfg.moe_intermediate_size
    rows = [(("embed",), (cfg.vocab_size, D), ("vocab", "embed")),
            (("norm",), (D,), ("embed",))]
    rows += hyper.head_rows(cfg.hc_dims, ("hc_head",))
    if not cfg.tie_word_embeddings:
        rows.append((("lm_head",), (D, cfg.vocab_size), ("embed", "vocab")))
    for i, kind in enumerate(cfg.layer_types):
        L = ("layers", i)
        A = L + ("attn",)
        rows += [(A + ("q_a",), (D, r), ("embed", None)), (A + ("q_a_norm",), (r,), (None,)),
                 (A + ("q_b",), (r, H * hd), (None, "heads")),
                 (A + ("kv",), (D, hd), ("embed", None)), (A + ("kv_norm",), (hd,), (None,)),
                 (A + ("o_a",), (cfg.o_groups, H * hd // cfg.o_groups, cfg.o_lora_rank),
                  (None, "heads", None)),
                 (A + ("o_b",), (cfg.o_groups * cfg.o_lora_rank, D), (None, "embed")),
                 (A + ("sinks",), (H,), ("heads",))]
        if kind == "heavily_compressed_attention":
            rows += _compressor_rows(A + ("compressor",), D, hd, cfg.hca_rate, False)
        elif kind == "compressed_sparse_attention":
            C = A + ("compressor",)
            d, n = cfg.index_head_dim, cfg.index_n_heads
            rows += _compressor_rows(C, D, hd, cfg.csa_rate, True)
            rows += _compressor_rows(C + ("indexer",), D, d, cfg.csa_rate, True)
            rows += [(C + ("indexer", "q_b"), (r, n * d), (None, "heads")),
                     (C + ("indexer", "weights"), (D, n), ("embed", None))]
        M = L + ("moe",)
        rows.append((M + ("router",), (D, E), ("embed", None)))
        rows += mlp_rows(M + ("experts",), D, F, E)
        rows += mlp_rows(M + ("shared",), D, F)
        if cfg.mlp_layer_types[i] == "hash_moe":
            rows.append((M + ("tid2eid",), (cfg.vocab_size, cfg.top_k), ("vocab", None)))
        else:
            rows.append((M + ("router_bias",), (E,), (None,)))
        for n in ("attn_hc", "ffn_hc"):
            rows += hyper.rows(cfg.hc_dims, L + (n,))
        rows += [(L + ("input_norm",), (D,), ("embed",)), (L + ("post_norm",), (D,), ("embed",))]
    return rows


def param_count(cfg: Config) -> dict:
    """Total parameters and those one token reads (k of the routed experts); the hash
    layers' token-id tables are counted (they are parameters, integers)."""
    rows = param_table(cfg)
    total = sum(int(np.prod(s)) for _, s, _ in rows)
    routed = sum(int(np.prod(s)) for p, s, _ in rows if "experts" in p)
    return {"total": total, "active": total - routed // cfg.num_experts
            * (cfg.num_experts - cfg.top_k)}


def param_dtype(cfg: Config, path) -> str:
    """``cfg.dtype``, except the hash layers' token-id table (int32)."""
    return "int32" if path[-1] == "tid2eid" else cfg.dtype


def init(cfg: Config, key):
    """Fresh parameters (a training plan's shapes; no trained meaning): weights N(0, 0.02),
    norm gains 1, biases 0, each hash table token t -> experts (t + j) mod E."""
    import zlib

    def leaf(path, shape):
        name, dt = path[-1], param_dtype(cfg, path)
        if name == "tid2eid":
            return (jnp.arange(shape[0])[:, None] + jnp.arange(shape[1])) % cfg.num_experts
        if name.endswith("norm") or name == "scale":
            return jnp.ones(shape, dt)
        if name in ("router_bias", "base", "sinks", "position_bias"):
            return jnp.zeros(shape, dt)
        k = jax.random.fold_in(key, zlib.crc32("/".join(map(str, path)).encode()))
        return (0.02 * jax.random.normal(k, shape)).astype(dt)
    return table.tree(param_table(cfg), leaf)


def logical_axes(cfg: Config):
    """Logical axis names of every parameter (a pytree of PartitionSpec)."""
    axes = {p: a for p, _, a in param_table(cfg)}
    return table.tree(param_table(cfg), lambda path, _: jax.sharding.PartitionSpec(*axes[path]))


# --------------------------------------------------------------------------------------------
# Rotary (trailing channels, interleaved pairs)
# --------------------------------------------------------------------------------------------

def angles(cfg: Config, kind: str, index):
    """(cos, sin) (.., rope_dim / 2) float32 at integer positions ``index``."""
    inv = jnp.asarray(rotary_lib.inv_frequencies(cfg.rope(kind)))
    a = index.astype(F32)[..., None] * inv
    return jnp.cos(a), jnp.sin(a)


def rope_at(cfg: Config, kind: str, positions):
    """:func:`angles` with a batch axis: positions (T,) shared by the batch, or (B, T)."""
    cos, sin = angles(cfg, kind, positions)
    return (cos[None], sin[None]) if positions.ndim == 1 else (cos, sin)


def rotate(x, cos, sin):
    """x (B, T, [H,] d): its last 2 cos.shape[-1] channels rotated in pairs (2i, 2i+1)."""
    r = cos.shape[-1] * 2
    if x.ndim == 4:
        cos, sin = cos[:, :, None], sin[:, :, None]
    rest, rot = x[..., :-r], x[..., -r:].astype(F32)
    a, b = rot[..., 0::2], rot[..., 1::2]
    rot = jnp.stack([a * cos - b * sin, b * cos + a * sin], axis=-1).reshape(rot.shape)
    return jnp.concatenate([rest, rot.astype(x.dtype)], axis=-1)


def unit_rms(x, eps):
    """RMSNorm with no weight over the last axis (statistics in float32)."""
    return x * jax.lax.rsqrt(jnp.mean(jnp.square(x.astype(F32)), -1, keepdims=True)
                             + eps).astype(x.dtype)


# --------------------------------------------------------------------------------------------
# Compressors and the lightning indexer
# --------------------------------------------------------------------------------------------

def pool(cfg: Config, p, x, rate: int, dim: int, overlap: bool):
    """Compressed entries (B, T // rate, dim): per channel, a softmax(gate + position_bias)
    weighted sum of a window's projections (with ``overlap``, the previous window's first
    series too), RMS-normed, rotated ("compress") at the window's first position."""
    B, T, _ = x.shape
    n = T // rate
    if n == 0:
        return jnp.zeros((B, 0, dim), x.dtype)
    kv = (x[:, :n * rate] @ p["kv"]).reshape(B, n, rate, -1)
    gate = (x[:, :n * rate] @ p["gate"]).reshape(B, n, rate, -1) + p["position_bias"]
    if overlap:     # slots: [previous window's first series | this window's second series]
        prev_kv = jnp.pad(kv[:, :-1, :, :dim], ((0, 0), (1, 0), (0, 0), (0, 0)))
        prev_gate = jnp.pad(gate[:, :-1, :, :dim], ((0, 0), (1, 0), (0, 0), (0, 0)),
                            constant_values=-jnp.inf)
        kv, gate = overlap_slots(prev_kv, prev_gate, kv, gate, dim)
    return pool_windows(cfg, p, kv, gate, jnp.arange(n) * rate)


def overlap_slots(prev_kv, prev_gate, kv, gate, dim: int):
    """A CSA window's 2 rate slots: the previous window's first series (.., rate, dim),
    then this window's second series (its last ``dim`` channels)."""
    return (jnp.concatenate([prev_kv, kv[..., dim:]], axis=-2),
            jnp.concatenate([prev_gate, gate[..., dim:]], axis=-2))


def pool_windows(cfg: Config, p, kv, gate, starts):
    """Entries (B, n, dim) of windows' slots kv, gate (B, n, slots, dim) starting at
    positions ``starts`` ((n,) or (B, n)): the pool the forward and the cache share."""
    w = jax.nn.softmax(gate.astype(F32), axis=2).astype(kv.dtype)
    entries = rms_norm(jnp.sum(kv * w, axis=2), p["kv_norm"], cfg.rms_norm_eps)
    return rotate(entries, *rope_at(cfg, "compress", starts))


def visible_entries(rate: int, n_entries: int, positions):
    """(.., T, n) for positions (.., T): query t may see entry w once its window closed,
    (w + 1) rate <= t + 1."""
    return jnp.arange(n_entries) < ((positions + 1) // rate)[..., None]


def indexer_scores(cfg: Config, p, x, q_res, positions, keys=None):
    """The lightning indexer's scores (B, T, n) float32 of every query against every entry
    (``keys``: the indexer's compressed keys (B, n, d), cached; default: pooled from x)."""
    B, T, _ = x.shape
    d, H = cfg.index_head_dim, cfg.index_n_heads
    if keys is None:
        keys = pool(cfg, p, x, cfg.csa_rate, d, overlap=True)
    keys = keys.astype(F32)
    cos, sin = rope_at(cfg, "compress", positions)
    q = rotate((q_res @ p["q_b"]).reshape(B, T, H, d), cos, sin).astype(F32)
    s = jax.nn.relu(jnp.einsum("bthd,bwd->bthw", q, keys)) * F32(d ** -0.5)
    w = (x @ p["weights"]).astype(F32) * F32(H ** -0.5)
    return jnp.einsum("bthw,bth->btw", s, w)


def index_select(cfg: Config, scores, positions):
    """The entries each query attends to (B, T, n) bool: the top ``index_topk`` of the
    scores it may see (fewer when fewer are visible; ``components.indexer.select``)."""
    if scores.shape[-1] == 0:
        return jnp.zeros(scores.shape, bool)
    return indexer_lib.select(scores, visible_entries(cfg.csa_rate, scores.shape[-1], positions),
                              cfg.index_topk)


# --------------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------------

def project(cfg: Config, kind: str, p, x, positions):
    """A block's queries (B, T, H, hd), its shared key = value (B, T, hd), the normed
    low-rank query (the indexer's input) and the rotary (cos, sin) at ``positions``."""
    B, T, _ = x.shape
    cos, sin = rope_at(cfg, "main" if kind == "sliding_attention" else "compress", positions)
    q_res = rms_norm(x @ p["q_a"], p["q_a_norm"], cfg.rms_norm_eps)
    q = rotate(unit_rms((q_res @ p["q_b"]).reshape(B, T, cfg.n_heads, cfg.head_dim),
                        cfg.rms_norm_eps), cos, sin)
    kv = rotate(rms_norm(x @ p["kv"], p["kv_norm"], cfg.rms_norm_eps), cos, sin)
    return q, kv, q_res, (cos, sin)


def window_mask(cfg: Config, q_pos, k_pos):
    """(.., Tq, Tk): a query sees its own layer's keys within ``sliding_window`` before it."""
    dist = q_pos[..., :, None] - k_pos[..., None, :]
    return (dist >= 0) & (dist < cfg.sliding_window)


def attention(cfg: Config, kind: str, p, x, positions, given):
    """One V4 attention block of x (B, T, D): (y, {"indexer": scores} or {})."""
    B, T, _ = x.shape
    q, kv, q_res, (cos, sin) = project(cfg, kind, p, x, positions)
    mask = jnp.broadcast_to(window_mask(cfg, positions, positions), (B, T, T))
    keys, used = kv, {}
    if kind == "heavily_compressed_attention":
        entries = pool(cfg, p["compressor"], x, cfg.hca_rate, cfg.head_dim, overlap=False)
        vis = visible_entries(cfg.hca_rate, entries.shape[1], positions)
        keys = jnp.concatenate([kv, entries], axis=1)
        mask = jnp.concatenate([mask, jnp.broadcast_to(vis, (B, *vis.shape))], axis=-1)
    elif kind == "compressed_sparse_attention":
        c = p["compressor"]
        entries = pool(cfg, c, x, cfg.csa_rate, cfg.head_dim, overlap=True)
        used = coeffs_lib.site({"indexer": indexer_scores(cfg, c["indexer"], x, q_res,
                                                          positions)}, given)
        chosen = index_select(cfg, used["indexer"], positions)
        keys = jnp.concatenate([kv, entries], axis=1)
        mask = jnp.concatenate([mask, chosen], axis=-1)
    return attend(cfg, p, q, keys, mask, cos, sin), used


def attend(cfg: Config, p, q, keys, mask, cos, sin):
    """Sink softmax of q (B, T, H, hd) over the keys = values (B, S, hd) ``mask`` (B, T, S)
    admits, the output's rotation undone, the grouped low-rank output projection."""
    B, T = q.shape[:2]
    logits = jnp.einsum("bthd,bsd->bhts", q, keys) * F32(cfg.head_dim ** -0.5)
    probs = attention_lib.sink_softmax(jnp.where(mask[:, None], logits, -jnp.inf), p["sinks"])
    out = jnp.einsum("bhts,bsd->bthd", probs, keys)
    out = rotate(out, cos, -sin)                          # undo the values' rotation
    G = cfg.o_groups
    grouped = jnp.einsum("btgi,gir->btgr", out.reshape(B, T, G, -1), p["o_a"])
    return grouped.reshape(B, T, -1) @ p["o_b"]


# --------------------------------------------------------------------------------------------
# Routing and experts
# --------------------------------------------------------------------------------------------

def router_scores(p, x):
    """s = sqrt(softplus(x W)) float32 (B, T, E): what both router kinds record."""
    return jnp.sqrt(jax.nn.softplus((x @ p["router"]).astype(F32)))


def route(cfg: Config, p, scores, tokens):
    """(experts (B, T, k), weights): a hash layer's from ``tid2eid[tokens]``, a learned
    layer's the top-k of s + bias; weights the chosen s renormalised, times the scale."""
    if "tid2eid" in p:
        experts = routers.table_experts(p["tid2eid"], tokens)
    else:
        experts = jax.lax.top_k(scores + p["router_bias"].astype(F32), cfg.top_k)[1]
    return experts, routers.weigh(scores, experts, True, cfg.routed_scaling_factor)


def moe(cfg: Config, p, x, tokens, given):
    """The MoE FFN of x (B, T, D): (y, {"router" | "hash_router": s} after its site)."""
    B, T, D = x.shape
    name = "hash_router" if "tid2eid" in p else "router"
    used = coeffs_lib.site({name: router_scores(p, x)}, given)
    experts, weights = route(cfg, p, used[name], tokens)
    limit = cfg.swiglu_limit
    k = experts.shape[-1]
    order = jnp.argsort(experts.reshape(B * T, k), axis=-1)   # transformers' summation order
    e, w = (jnp.take_along_axis(a.reshape(B * T, k), order, -1) for a in (experts, weights))

    def grouped(ws, rows, groups):
        mm = lambda a, n: dispatch.grouped_matmul(a, ws[n], groups)
        return mm(clamped_glu(mm(rows, "gate"), mm(rows, "up"), limit), "down")
    y = dispatch.dropless(x.reshape(B * T, D), e, w.astype(x.dtype), cfg.num_experts,
                          grouped, expert_params=p["experts"]).reshape(B, T, D)
    s = p["shared"]
    shared = clamped_glu(x @ s["gate"], x @ s["up"], limit) @ s["down"]
    return y + shared, used


def selected_experts(cfg: Config, params, coeffs, tokens):
    """The experts (layer, B, T, k) every layer's MoE takes given recorded ``coeffs``: a
    hash layer's ``tid2eid[tokens]``, a learned layer's top-k of its scores + bias."""
    by_kind = {"hash_moe": iter(coeffs.get("hash_router", ())),
               "moe": iter(coeffs.get("router", ()))}
    return jnp.stack([route(cfg, p["moe"], next(by_kind[kind]), tokens)[0]
                      for p, kind in zip(params["layers"], cfg.mlp_layer_types)])


# --------------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------------

def _slice(given, name, j):
    return coeffs_lib.part(given, lambda v: jax.tree.map(lambda a: a[j], v[name]))


def forward(cfg: Config, params, tokens, coeffs=None):
    """``(logits float32 (B, T, V), coeffs)``: None records, a pytree replays, a Given is
    either (one compiled program for both)."""
    positions = jnp.arange(tokens.shape[1])

    def attend_layer(i, p, x, given):
        return attention(cfg, cfg.layer_types[i], p, x, positions, given)
    return run(cfg, params, tokens, attend_layer, coeffs_lib.as_given(coeffs), cfg.remat)


def run(cfg: Config, params, tokens, attend_layer, given, remat: bool = False):
    """The embedding, every layer behind its two hyper-connections, the head: (logits,
    coeffs). ``attend_layer(i, p, x, given) -> (y, {"indexer": scores} or {})`` is layer
    i's attention: the forward's over the sequence, or the decoder's against its cache
    (``dynjax.decoding.deepseek_v4``, given None: nothing recorded)."""
    dims = cfg.hc_dims
    h = hyper.expand_embeddings(dims, jnp.take(params["embed"], tokens, axis=0))
    used = {"mhc_attn": [], "mhc_ffn": [], "router": [], "hash_router": [], "indexer": []}

    def layer(i, p, h):
        """One layer: (streams, its mHC coefficients around attention and the FFN, the
        indexer's / router's)."""
        inner = {}

        def attn_block(z):
            y, c = attend_layer(i, p["attn"], rms_norm(z, p["input_norm"], cfg.rms_norm_eps),
                                _inner_given(given, "indexer", used))
            inner.update(c)
            return y

        def ffn_block(z):
            name = "hash_router" if "tid2eid" in p["moe"] else "router"
            y, c = moe(cfg, p["moe"], rms_norm(z, p["post_norm"], cfg.rms_norm_eps), tokens,
                       _inner_given(given, name, used))
            inner.update(c)
            return y
        h, c_attn = hyper.around(dims, p["attn_hc"], h, attn_block, _slice(given, "mhc_attn", i))
        h, c_ffn = hyper.around(dims, p["ffn_hc"], h, ffn_block, _slice(given, "mhc_ffn", i))
        return h, c_attn, c_ffn, inner
    for i, p in enumerate(params["layers"]):
        step = functools.partial(layer, i)
        if remat:   # training plans: keep each layer's input, recompute the rest
            step = jax.checkpoint(step)
        h, c_attn, c_ffn, inner = step(p, h)
        used["mhc_attn"].append(c_attn)
        used["mhc_ffn"].append(c_ffn)
        for name, value in inner.items():
            used[name].append(value)
    y, head = hyper.head(dims, params["hc_head"], h,
                         coeffs_lib.part(given, lambda v: v["mhc_head"]))
    y = rms_norm(y, params["norm"], cfg.rms_norm_eps)
    w = params["embed"].T if cfg.tie_word_embeddings else params["lm_head"]
    logits = (y @ w).astype(F32)
    out = {name: jax.tree.map(lambda *a: jnp.stack(a), *v) for name, v in used.items() if v}
    out["mhc_head"] = head
    return logits, out


def _inner_given(given, name, used):
    """The given values of family ``name`` at the next layer that has it."""
    return coeffs_lib.part(given, lambda v: {name: v[name][len(used[name])]})


@dataclasses.dataclass(frozen=True)
class DeepseekV4:
    """The registry-style interface: ``apply(params, tokens, coeffs=None) -> (logits,
    coeffs)``, ``schema``, ``init``, ``logical_axes``."""

    cfg: Config
    # the audit's coefficient families (dynjax.audit.families): the mHC sites around attention,
    # the FFN and the head are one residual-mixing mechanism, audited together as the seed's
    # MUDD conditions are; router, hash_router and indexer each their own
    site_families = {"mhc": ("mhc_attn", "mhc_ffn", "mhc_head")}
    # what a family's table must say beside its numbers
    site_notes = {"hash_router": (
        "hash layers: the experts are tid2eid[token], a parameter (the same table in every "
        "context), not a coefficient; these scores only weight them, so every condition here "
        "moves the mixing weights alone: the static control of routing (its experts are a "
        "lookup of the token id by construction)")}

    @property
    def schema(self):
        return schema(self.cfg)

    def init(self, key, tokens=None):
        return init(self.cfg, key)

    def logical_axes(self, tokens=None):
        return logical_axes(self.cfg)

    def sizes(self, n_windows: int, seq_len: int, batch: int) -> dict:
        """An audit's sizes from the config alone (the keys of ``dynjax.measure.execution.
        llm_estimate``): parameters, the coefficient cache of ``n_windows`` (shapes traced,
        nothing computed), a rough upper bound of one forward's live activations at
        ``batch`` rows (the hc streams, one layer's float32 attention logits, the logits)
        and 2 x active parameters FLOPs per token (attention's own FLOPs not counted)."""
        cfg = self.cfg
        count = param_count(cfg)
        params = table.tree(param_table(cfg), lambda path, shape: jax.ShapeDtypeStruct(
            shape, jnp.dtype(param_dtype(cfg, path))))
        coeffs = jax.eval_shape(lambda p, t: forward(cfg, p, t)[1], params,
                                jax.ShapeDtypeStruct((1, seq_len), jnp.int32))
        per_window = sum(int(np.prod(a.shape)) * a.dtype.itemsize
                         for a in jax.tree.leaves(coeffs))
        item = jnp.dtype(cfg.dtype).itemsize
        act = batch * seq_len * (3 * cfg.hc * cfg.hidden_size * item + cfg.vocab_size * 4
                                 + 2 * cfg.top_k * cfg.moe_intermediate_size * item)
        act += 2 * batch * cfg.n_heads * seq_len * (seq_len + seq_len // cfg.csa_rate) * 4
        flops = 2 * count["active"] * seq_len
        return {"param_count": count["total"], "active_param_count": count["active"],
                "param_bytes": count["total"] * item,
                "coeff_cache_bytes": n_windows * per_window,
                "activation_bytes_per_batch": act, "record_flops_per_window": flops,
                "replay_flops_per_window": flops}

    def apply(self, params, tokens, coeffs=None, *, with_aux=False):
        """``(logits, coeffs)``; ``with_aux`` adds the auxiliary losses: none (a port of a
        trained checkpoint)."""
        given = coeffs_lib.as_given(coeffs)
        if given.values is not None:
            coeffs_lib.check(given.values, self.schema)
        logits, used = forward(self.cfg, params, tokens, given)
        return (logits, used, {}) if with_aux else (logits, used)


# --------------------------------------------------------------------------------------------
# Loading a transformers checkpoint
# --------------------------------------------------------------------------------------------

DEFAULTS = {f.name: f.default for f in dataclasses.fields(Config)}


def config_from_hf(hf: dict, dtype: str = "float32") -> Config:
    """``Config`` of a deepseek_v4 config.json (transformers' defaults where omitted,
    legacy ``compress_ratios`` / ``num_hash_layers`` / ``qk_rope_head_dim`` folded in);
    its quantization is the reader's business (``dynjax.loaders.deepseek_v4``)."""
    if hf.get("model_type") != "deepseek_v4":
        raise ConfigError(f"config.json model_type={hf.get('model_type')!r}; this loader reads "
                          "deepseek_v4")
    n = int(hf.get("num_hidden_layers", 43))
    rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128,
             **(hf.get("compress_rates") or {})}
    types = hf.get("layer_types")
    if types is None and hf.get("compress_ratios") is not None:
        by_rate = {0: "sliding_attention", 4: "compressed_sparse_attention",
                   128: "heavily_compressed_attention"}
        types = [by_rate[r] for r in hf["compress_ratios"]]
    if types is None:
        types = ["heavily_compressed_attention"] * min(n, 2) + [
            "compressed_sparse_attention" if i % 2 else "heavily_compressed_attention"
            for i in range(max(n - 2, 0))]
    mlp = hf.get("mlp_layer_types")
    if mlp is None:
        n_hash = int(hf.get("num_hash_layers", 3))
        mlp = ["hash_moe"] * min(n, n_hash) + ["moe"] * max(0, n - n_hash)
    head_dim = int(hf.get("head_dim", 512))
    factor = hf.get("partial_rotary_factor")
    rope_dim = int(head_dim * factor) if factor else int(hf.get("qk_rope_head_dim", 64))
    rp = hf.get("rope_parameters") or {}
    compress = rp.get("compress") if isinstance(rp.get("compress"), dict) else {
        k: v for k, v in rp.items() if k not in ("main", "compress")}
    compress = {k: v for k, v in compress.items()
                if k in ("rope_type", "factor", "original_max_position_embeddings",
                         "beta_fast", "beta_slow", "truncate")}
    if compress.get("rope_type", "default") not in ("default", "yarn"):
        raise ConfigError(f"deepseek_v4: compress rope_type={compress['rope_type']!r} is not "
                          "ported (default, yarn)")
    if hf.get("scoring_func", "sqrtsoftplus") != "sqrtsoftplus":
        raise ConfigError(f"deepseek_v4: scoring_func={hf['scoring_func']!r} is not ported "
                          "(sqrtsoftplus)")
    if hf.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"deepseek_v4: hidden_act={hf['hidden_act']!r}; only silu is ported")
    g = lambda key, default: hf.get(key, default)
    return Config(
        vocab_size=g("vocab_size", 129280), hidden_size=g("hidden_size", 4096),
        n_heads=g("num_attention_heads", 64), head_dim=head_dim, rope_dim=rope_dim,
        q_lora_rank=g("q_lora_rank", 1024), layer_types=tuple(types[:n]),
        mlp_layer_types=tuple(mlp[:n]),
        csa_rate=int(rates["compressed_sparse_attention"]),
        hca_rate=int(rates["heavily_compressed_attention"]),
        sliding_window=g("sliding_window", 128), o_groups=g("o_groups", 8),
        o_lora_rank=g("o_lora_rank", 1024), index_n_heads=g("index_n_heads", 64),
        index_head_dim=g("index_head_dim", 128), index_topk=g("index_topk", 512),
        num_experts=g("n_routed_experts", 256), top_k=g("num_experts_per_tok", 6),
        moe_intermediate_size=g("moe_intermediate_size", 2048),
        routed_scaling_factor=g("routed_scaling_factor", 1.5),
        swiglu_limit=g("swiglu_limit", 10.0), hc=g("hc_mult", 4),
        hc_sinkhorn_iters=g("hc_sinkhorn_iters", 20), hc_eps=g("hc_eps", 1e-6),
        rms_norm_eps=g("rms_norm_eps", 1e-6),
        rope_theta=(rp.get("main") or {}).get("rope_theta", g("rope_theta", 10000.0)),
        compress_rope_theta=(rp.get("compress") or {}).get(
            "rope_theta", g("compress_rope_theta", 160000.0)),
        compress_rope=tuple(sorted(compress.items())),
        tie_word_embeddings=g("tie_word_embeddings", False), dtype=jnp.dtype(dtype).name)


def params_from_tensors(cfg: Config, get, place=None):
    """The params pytree from ``get(name) -> np.ndarray`` under DeepSeek's checkpoint names
    (``layers.0.attn.wq_a.weight``, ``layers.0.ffn.experts.3.w1.weight``, ...; the names
    transformers' save_pretrained writes back), linear weights transposed to (in, out), the
    grouped ``wo_a`` split by group, the per-expert w1/w3/w2 stacked as gate/up/down.
    ``place(path, array)``: what each leaf becomes (e.g. a device array), applied a layer at
    a time, so the host holds one layer's tensors, not the checkpoint."""
    place = place or (lambda path, a: a)

    def placed(tree, path):
        return jax.tree_util.tree_map_with_path(
            lambda p, a: place(path + tuple(getattr(k, "key", getattr(k, "idx", k))
                                            for k in p), a), tree)
    lin = lambda name: get(name + ".weight").T
    out = placed({"embed": get("embed.weight"), "norm": get("norm.weight"),
                  "hc_head": {"fn": get("hc_head_fn").T, "base": get("hc_head_base"),
                              "scale": get("hc_head_scale")}}, ())
    out["layers"] = []
    if not cfg.tie_word_embeddings:
        out["lm_head"] = place(("lm_head",), lin("head"))

    def compressor(pre):
        return {"kv": lin(pre + ".wkv"), "gate": lin(pre + ".wgate"),
                "position_bias": get(pre + ".ape"), "kv_norm": get(pre + ".norm.weight")}

    def mlp(pre):
        return {"gate": lin(pre + ".w1"), "up": lin(pre + ".w3"), "down": lin(pre + ".w2")}
    for i, kind in enumerate(cfg.layer_types):
        L = f"layers.{i}."
        A = L + "attn."
        o_a = get(A + "wo_a.weight")
        attn = {"q_a": lin(A + "wq_a"), "q_a_norm": get(A + "q_norm.weight"),
                "q_b": lin(A + "wq_b"), "kv": lin(A + "wkv"), "kv_norm": get(A + "norm.weight"),
                "o_a": o_a.reshape(cfg.o_groups, cfg.o_lora_rank, -1).transpose(0, 2, 1),
                "o_b": lin(A + "wo_b"), "sinks": get(A + "attn_sink")}
        if kind != "sliding_attention":
            attn["compressor"] = compressor(A + "compressor")
        if kind == "compressed_sparse_attention":
            attn["compressor"]["indexer"] = dict(
                compressor(A + "indexer.compressor"), q_b=lin(A + "indexer.wq_b"),
                weights=lin(A + "indexer.weights_proj"))
        F = L + "ffn."
        experts = [mlp(F + f"experts.{e}") for e in range(cfg.num_experts)]
        moe_p = {"router": lin(F + "gate"),
                 "experts": {n: np.stack([e[n] for e in experts]) for n in ("gate", "up", "down")},
                 "shared": mlp(F + "shared_experts")}
        if cfg.mlp_layer_types[i] == "hash_moe":
            moe_p["tid2eid"] = get(F + "gate.tid2eid").astype(np.int32)
        else:
            moe_p["router_bias"] = get(F + "gate.bias")
        hc = lambda n: {"fn": get(L + f"hc_{n}_fn").T, "base": get(L + f"hc_{n}_base"),
                        "scale": get(L + f"hc_{n}_scale")}
        out["layers"].append(placed({
            "attn": attn, "moe": moe_p, "attn_hc": hc("attn"), "ffn_hc": hc("ffn"),
            "input_norm": get(L + "attn_norm.weight"), "post_norm": get(L + "ffn_norm.weight")},
            ("layers", i)))
    return out
