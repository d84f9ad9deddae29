"""The decoder-only byte Transformer core that every sequence family builds on.

Pre-norm blocks with rotary positions and causal attention. A block returns its whole
*update* ``F(h) = a + m`` rather than the new hidden state, so each family decides how the
update enters the residual stream (a gate, a router weight, a cross-layer mix); positions
are explicit per token, so a family that gathers tokens keeps their rotary angles. Params
and activations carry logical axis names for ``dynjax.parallel.sharding``.
Depth: docs/models.md#the-transformer-core-dynjaxmodelstransformerpy
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from dynjax.models import matmul
from dynjax.models import sections
from dynjax.models.activation_sharding import HEADS, HIDDEN, LOGITS, TOKENS, constrain
from dynjax.models.sections import GateConfig, ModConfig, MoEConfig, MuddConfig

SECTIONS = {"gates": GateConfig, "mod": ModConfig, "moe": MoEConfig, "mudd": MuddConfig}

ATTN_IMPLS = ("jnp", "xla", "cudnn")
MASK_VALUE = -1e30  # large finite: keeps fully masked rows (none occur causally) NaN-free


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of a byte-level decoder; hashable so it can be a Linen field."""

    family: str = "gates"          # which model family builds on this core
    variant: str = "feature_gate"  # family-specific variant (gates: dense, uniform, ...)
    vocab_size: int = 256
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 512
    rope_base: float = 10000.0
    dtype: str = "float32"         # compute dtype; parameters are always float32
    scan_layers: bool = True       # nn.scan over layers: compile time flat in depth
    remat: bool = False            # rematerialise each layer in the backward pass
    attn_impl: str = "jnp"         # "jnp": causal_attention (CPU); "xla" | "cudnn": fused
                                   # jax.nn.dot_product_attention (cudnn: flash, GPU, bf16)
    attn_block: int = 128          # jnp: query blocks over their key prefix (0: full T x T)
    remat_save_dots: bool = False  # remat: keep matmul outputs too, recompute the rest
    # each dynamic family's own section (dynjax.models.sections); flat names map into them
    gates: GateConfig = dataclasses.field(default_factory=GateConfig)
    mod: ModConfig = dataclasses.field(default_factory=ModConfig)
    moe: MoEConfig = dataclasses.field(default_factory=MoEConfig)
    mudd: MuddConfig = dataclasses.field(default_factory=MuddConfig)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)

    @classmethod
    def from_dict(cls, d) -> "ModelConfig":
        """The config of a flat dict (a ConfigDict's ``to_dict()``, a run's config.json)."""
        cfg = cls().replace(**d)
        cfg.validate()
        return cfg

    def replace(self, **changes) -> "ModelConfig":
        """A copy with ``changes``: core fields, whole sections, or section fields by their
        flat names (``mod_capacity=0.5``), as config files and command lines spell them."""
        flat = sections.flat_names(SECTIONS)
        unknown = sorted(set(changes) - set(flat) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"unknown model config field(s) {unknown}; known fields: "
                             f"{sorted(self.to_dict())}")
        top = {k: v for k, v in changes.items() if k not in flat}
        per_section = {}
        for k in set(changes) & set(flat):
            attr, name = flat[k]
            per_section.setdefault(attr, {})[name] = changes[k]
        for attr, fields in per_section.items():
            top[attr] = dataclasses.replace(top.get(attr, getattr(self, attr)), **fields)
        return dataclasses.replace(self, **top)

    def to_dict(self) -> dict:
        """The flat dict ``from_dict`` reads back (the names config files use)."""
        core = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in SECTIONS}
        return {**core, **sections.flatten(self, SECTIONS)}

    def validate(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"model.d_model={self.d_model} is not divisible by "
                             f"model.n_heads={self.n_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head dim {self.head_dim} must be even for rotary positions")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"model.dtype={self.dtype!r}; use 'float32' or 'bfloat16'")
        if self.n_layers < 1:
            raise ValueError(f"model.n_layers={self.n_layers} must be at least 1")
        if not self.rope_base > 0:   # 0 gives 0 ** 0 and 0 ** -x: NaN angles, a NaN loss
            raise ValueError(f"model.rope_base={self.rope_base} must be positive (the rotary "
                             "base; the usual value is 10000)")
        if self.attn_impl not in ATTN_IMPLS:
            raise ValueError(f"model.attn_impl={self.attn_impl!r}; use one of {ATTN_IMPLS}")
        if self.attn_block < 0:
            raise ValueError(f"model.attn_block={self.attn_block} must be >= 0 (0: full)")


def dense_init(axes, scale=1.0):
    """Variance-scaling kernel init annotated with logical axis names."""
    return nn.with_logical_partitioning(
        nn.initializers.variance_scaling(scale, "fan_in", "truncated_normal"), axes)


class Positions(NamedTuple):
    """Where each token sits: ``index`` (B, T) int32, what causal masks compare, and the
    cos and sin (B, T, Dh/2) float32 of its rotary angles, made once per forward by
    :func:`token_positions` and gathered along with the tokens (Mixture-of-Depths)."""

    index: jax.Array
    cos: jax.Array
    sin: jax.Array

    def take(self, idx):
        """The positions of the tokens ``idx`` (B, k)."""
        return jax.tree.map(lambda a: take_tokens(a, idx), self)


def take_tokens(a, idx):
    """The tokens ``idx`` (B, k) of a (B, T, ...): (B, k, ...)."""
    return jnp.take_along_axis(a, idx.reshape(idx.shape + (1,) * (a.ndim - 2)), 1)


def token_positions(cfg: ModelConfig, index, bound: int | None = None) -> Positions:
    """The :class:`Positions` of tokens at integer positions ``index`` (B, T).

    With a static ``bound`` (every index is below it) the angles are evaluated once per
    position, in a (bound, Dh/2) table that is then gathered. XLA:CPU fuses the direct form
    into every layer's rotation and so evaluates cos and sin again for each layer, head
    and dimension (5-6% of a d=256, T=1024 forward); it does not fuse through a gather.
    Both forms give the same bits.
    """
    half = cfg.head_dim // 2
    freq = cfg.rope_base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    index = index.astype(jnp.int32)
    if bound is None:
        angle = index.astype(jnp.float32)[..., None] * freq            # (B, T, half)
        return Positions(index, jnp.cos(angle), jnp.sin(angle))
    angle = jnp.arange(bound, dtype=jnp.float32)[:, None] * freq        # (bound, half)
    table = lambda f: jnp.take(f(angle), index, axis=0)
    return Positions(index, table(jnp.cos), table(jnp.sin))


def window_positions(cfg: ModelConfig, batch: int, length: int) -> Positions:
    """The :class:`Positions` of ``batch`` whole windows of ``length`` tokens from position 0."""
    index = jnp.broadcast_to(jnp.arange(length), (batch, length))
    return token_positions(cfg, index, bound=length)


def rotary(x, positions: Positions):
    """Rotate-half rotary embedding of x (B, T, H, Dh) at ``positions``."""
    half = x.shape[-1] // 2
    cos, sin = positions.cos[:, :, None], positions.sin[:, :, None]  # (B, T, 1, half)
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def attention_scores(q, k, scale=None):
    """Scaled float32 attention logits (B, H, Tq, Tk) of q (B, Tq, H, Dh), k (B, Tk, H, Dh);
    ``scale`` defaults to Dh^-1/2."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * scale


def _attend(q, k, v, q_pos, k_pos, row_stats, q0, scale=None):
    logits = attention_scores(q, k, scale)
    visible = (k_pos[:, None, :] <= q_pos[:, :, None])[:, None]  # (B, 1, Tq, Tk)
    logits = jnp.where(visible, logits, MASK_VALUE)
    lse = jax.nn.logsumexp(logits, axis=-1)
    probs = jnp.exp(logits - lse[..., None])
    out = matmul.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v)
    return out, lse, None if row_stats is None else row_stats(q0, logits, lse)


def causal_attention(q, k, v, q_pos, k_pos, block=0, row_stats=None, scale=None):
    """Softmax attention where query i sees key j iff k_pos[j] <= q_pos[i].

    ``block`` > 0 (self-attention, Tq == Tk): each block of ``block`` queries attends over its
    key prefix only (keys 0 .. end of the block), the position mask still applied inside.
    That equals the full form whenever a key at a later index than a query is invisible to
    it, i.e. tokens are in causal order, as every family keeps them (Mixture-of-Depths
    gathers its tokens in their original order; its unused decode slots, at position EMPTY,
    see extra keys but their output is discarded). It skips the masked half of the square.

    ``row_stats(q0, logits, lse)``, given the masked float32 logits (B, H, n, Tk') and
    log-sum-exp (B, H, n) of the queries q0 .. q0+n, returns per-query arrays (B, H, n, ...)
    that are concatenated over blocks (FeatureGate's features); the (B, H, Tq, Tk) square
    never exists as one array. ``scale``: the logits' factor (default Dh^-1/2); v may have
    its own head width. Returns (out (B, Tq, H, Dv), lse (B, H, Tq), stats or None).
    """
    T = q.shape[1]
    if block <= 0 or T != k.shape[1] or T <= block:
        return _attend(q, k, v, q_pos, k_pos, row_stats, 0, scale)
    parts = [_attend(q[:, i:i + block], k[:, :i + block], v[:, :i + block],
                     q_pos[:, i:i + block], k_pos[:, :i + block], row_stats, i, scale)
             for i in range(0, T, block)]
    out, lse, stats = zip(*parts)
    stats = None if row_stats is None else jnp.concatenate(stats, axis=2)
    return jnp.concatenate(out, axis=1), jnp.concatenate(lse, axis=-1), stats


def fused_attention(q, k, v, q_pos, k_pos, implementation):
    """causal_attention's output and lse through ``jax.nn.dot_product_attention`` (cuDNN's
    flash kernel with "cudnn"): no probabilities, so no controller statistics."""
    visible = (k_pos[:, None, :] <= q_pos[:, :, None])[:, None]
    out, lse = jax.nn.dot_product_attention(
        q, k, v, mask=visible, is_causal=q.shape[1] == k.shape[1],  # same keys, in order
        implementation=implementation, return_residual=True)
    return out, jnp.swapaxes(lse, 1, 2).astype(jnp.float32)  # (B, T, H) -> (B, H, T)


def per_token(layer, x):
    """``layer`` applied to x (B, T, ...) with B and T flattened into one token axis.

    Same arithmetic: training is bitwise the same on the CPU where this was measured, and
    within float rounding on an AVX2-only one, whose XLA:CPU kernels sum a weight gradient in
    another order. On XLA:CPU the weight gradient of a 2-D input is one plain matmul, where a
    3-D input's got a strided transpose fused into its producer (about a quarter of a d=256,
    T=1024 train step).
    """
    y = layer(x.reshape((-1,) + x.shape[2:]))
    return y.reshape(x.shape[:2] + y.shape[1:])


def head_projection(cfg: ModelConfig, name: str):
    """(B, T, D) -> (B, T, H, Dh): every attention's "query", "key" and "value" layers, so
    the attention variants of other families share parameter names and shapes."""
    return nn.DenseGeneral((cfg.n_heads, cfg.head_dim), use_bias=False, dtype=cfg.compute_dtype,
                           kernel_init=dense_init(("embed", "heads", "kv")), name=name)


def out_projection(cfg: ModelConfig):
    """(B, T, H, Dh) -> (B, T, D): every attention's "out" layer."""
    return nn.DenseGeneral(cfg.d_model, axis=(-2, -1), use_bias=False, dtype=cfg.compute_dtype,
                           kernel_init=dense_init(("heads", "kv", "embed")), name="out")


def project_qkv(cfg: ModelConfig, xq, xk, xv, q_positions: Positions, k_positions: Positions):
    """Every attention's rotary queries and keys and its values, (B, T, H, Dh) each. Call it
    inside a compact method: the "query", "key" and "value" layers belong to the caller."""
    q = rotary(per_token(head_projection(cfg, "query"), xq), q_positions)
    k = rotary(per_token(head_projection(cfg, "key"), xk), k_positions)
    v = per_token(head_projection(cfg, "value"), xv)
    return constrain(q, HEADS), constrain(k, HEADS), constrain(v, HEADS)


class Attention(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x, positions: Positions, row_stats=None):
        """Causal self-attention of x (B, T, D). Returns the output and (q, k, lse, stats):
        rotary queries and keys, the log-sum-exp and ``row_stats``'s per-query arrays (see
        causal_attention; None with a fused ``attn_impl``), for controllers."""
        cfg = self.cfg
        q, k, v = project_qkv(cfg, x, x, x, positions, positions)
        if cfg.attn_impl == "jnp":
            out, lse, stats = causal_attention(q, k, v, positions.index, positions.index,
                                               cfg.attn_block, row_stats)
        else:  # fused: row statistics, if wanted, are the caller's (gates.online_row_features)
            (out, lse), stats = fused_attention(q, k, v, positions.index, positions.index,
                                               cfg.attn_impl), None
        return constrain(per_token(out_projection(cfg), out), TOKENS), (q, k, lse, stats)


class Mlp(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg
        h = per_token(nn.Dense(cfg.d_ff, use_bias=False, dtype=cfg.compute_dtype,
                               kernel_init=dense_init(("embed", "mlp")), name="up"), x)
        h = constrain(h, HIDDEN)
        return constrain(per_token(nn.Dense(cfg.d_model, use_bias=False, dtype=cfg.compute_dtype,
                                            kernel_init=dense_init(("mlp", "embed")),
                                            name="down"), nn.gelu(h)), TOKENS)


def norm(name, cfg):
    return nn.RMSNorm(dtype=cfg.compute_dtype, name=name,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)))


class Block(nn.Module):
    """One pre-norm block. Returns its update F(h) = a + m and the attention statistics
    (``Attention``'s second output; ``row_stats`` as there)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, h, positions, row_stats=None):
        a, attn = Attention(self.cfg, name="attn")(norm("attn_norm", self.cfg)(h), positions,
                                                   row_stats=row_stats)
        m = Mlp(self.cfg, name="mlp")(norm("mlp_norm", self.cfg)(h + a))
        return constrain(a + m, TOKENS), attn


class Embed(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens):
        table = self.param("embedding", nn.with_logical_partitioning(
            nn.initializers.normal(1.0), ("vocab", "embed")),
            (self.cfg.vocab_size, self.cfg.d_model))
        # whole rows: a lookup into rows split over "fsdp" could not give a batch split there
        table = constrain(table, ("vocab", None))
        return constrain(jnp.take(table, tokens, axis=0).astype(self.cfg.compute_dtype), TOKENS)


def embed_tokens(cfg: ModelConfig, tokens):
    """Every decoder's start: token embeddings (B, T, D) and the tokens' :class:`Positions`.
    Call from a compact method; the embedding table is created as its child "embed"."""
    B, T = tokens.shape
    return Embed(cfg, name="embed")(tokens), window_positions(cfg, B, T)


class Head(nn.Module):
    """Final norm and untied output projection; logits are float32."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, h):
        h = norm("final_norm", self.cfg)(h)
        logits = per_token(nn.Dense(self.cfg.vocab_size, use_bias=False,
                                    dtype=self.cfg.compute_dtype,
                                    kernel_init=dense_init(("embed", "vocab")), name="lm_head"),
                           h)
        return constrain(logits, LOGITS).astype(jnp.float32)


# Values a layer tags with ``checkpoint_name(x, REMAT_SAVED)`` are kept for the backward pass
# under ``remat``; everything else is recomputed. For small values that are costly to recompute
# (FeatureGate's four features summarise two (T, T) attention maps per head).
REMAT_SAVED = "remat_saved"


def scan_layers(layer_cls, cfg: ModelConfig, length: int, name="layers", **kwargs):
    """Stack ``length`` copies of ``layer_cls`` (carry, xs) -> (carry, ys) along axis 0.

    With ``cfg.scan_layers`` the layers run under ``nn.scan`` (one compiled body); without
    it they are unrolled, which is what FLOP counting from the compiled program needs.
    """
    if cfg.remat:
        policy = jax.checkpoint_policies.save_only_these_names(REMAT_SAVED)
        if cfg.remat_save_dots:
            policy = jax.checkpoint_policies.save_from_both_policies(
                policy, jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
        layer_cls = nn.remat(layer_cls, prevent_cse=not cfg.scan_layers, policy=policy)
    if cfg.scan_layers:
        return nn.scan(layer_cls, variable_axes={"params": 0}, split_rngs={"params": True},
                       in_axes=0, length=length,
                       metadata_params={nn.PARTITION_NAME: "layers"})(
                           cfg, name=name, **kwargs)
    return _Unrolled(layer_cls, cfg, length, kwargs, name=name)


class _Unrolled(nn.Module):
    layer_cls: type
    cfg: ModelConfig
    length: int
    kwargs: dict

    @nn.compact
    def __call__(self, carry, xs):
        ys = []
        for i in range(self.length):
            x_i = jax.tree.map(lambda a: a[i], xs)
            carry, y = self.layer_cls(self.cfg, name=f"layer_{i}", **self.kwargs)(carry, x_i)
            ys.append(y)
        return carry, jax.tree.map(lambda *a: jnp.stack(a), *ys)


def next_token_nll(logits, tokens):
    """Per-position NLL (nats) of tokens[:, 1:] given logits[:, :-1]: shape (B, T-1)."""
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
