"""MUDDPythia: a Pythia-style decoder whose layers read a *dynamic dense* mix of all earlier layers.

Reimplemented from the description of the official PyTorch code (Caiyun-AI/MUDDFormer) and
checked against its reference outputs (``tests/data/muddpythia_tiny.npz``); plain JAX
functions over a params pytree, because a pretrained checkpoint is the main use. After every
block a DA MLP emits per-token coefficients mixing all earlier layers into the next block's
q, k, v, r streams: ``{"mix": [A_0 .. A_{L-1}]}``, recorded and replayed.
Depth: docs/models.md#muddpythias-forward-pass-dynjaxmodelsmuddpythiapy
"""
from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from dynjax import coeffs as coeffs_lib
from dynjax.coeffs import Axes

F32 = jnp.float32

# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Config:
    """MUDDPythia architecture. Frozen and made of tuples, so it is hashable: a static jit arg."""

    n_layer: int
    dim: int
    n_head: int
    head_dim: int
    rotary_dims: int                 # rotary applies to the first rotary_dims of each head
    vocab_size: int
    ffn_widths: tuple[int, ...]      # FFN hidden width of each layer (grows with depth)
    da_widths: tuple[int, ...]       # hidden width K_i of each layer's DA controller MLP
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    block_size: int = 2048           # longest sequence (length of the official rope table)
    dtype: str = "float32"           # compute and parameter dtype: "float32" or "bfloat16"

    def __post_init__(self):
        object.__setattr__(self, "ffn_widths", tuple(int(w) for w in self.ffn_widths))
        object.__setattr__(self, "da_widths", tuple(int(w) for w in self.da_widths))
        if len(self.ffn_widths) != self.n_layer or len(self.da_widths) != self.n_layer:
            raise ValueError("ffn_widths and da_widths need one entry per layer")
        if self.n_head * self.head_dim != self.dim:
            raise ValueError(f"n_head * head_dim = {self.n_head * self.head_dim} != dim {self.dim}")
        if self.rotary_dims % 2 or not 0 <= self.rotary_dims <= self.head_dim:
            raise ValueError(f"rotary_dims {self.rotary_dims} must be even and <= head_dim")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype {self.dtype!r}: use 'float32' or 'bfloat16'")

    def n_streams(self, i: int) -> int:
        """C_i: streams fed by the mix after block i (q, k, v, r; only one after the last)."""
        return 4 if i < self.n_layer - 1 else 1

    def n_sources(self, i: int) -> int:
        """S_i: sources mixed after block i: the embedding and the outputs of blocks 0..i."""
        return i + 2


def schema(cfg: Config):
    """Named axes of the coefficient pytree: one (stream, example, token, source) leaf per layer."""
    return {"mix": [Axes(("stream", "example", "token", "source")) for _ in range(cfg.n_layer)]}


# --------------------------------------------------------------------------------------------
# Parameters: the official names and the params pytree
# --------------------------------------------------------------------------------------------

def param_table(cfg: Config):
    """(official name, path in our pytree, official shape, transpose?) for every parameter.

    Linear weights are stored (out, in) officially and (in, out) here, so ``x @ w`` reads
    like the math. This one table drives initialisation and the official checkpoints' I/O
    (:mod:`dynjax.loaders.muddpythia_hf`).
    """
    D, V, hd = cfg.dim, cfg.vocab_size, cfg.head_dim
    rows = [("tok_embeddings.weight", ("embed",), (V, D), False)]

    def linear(name, path, n_in, n_out, bias=True):
        rows.append((f"{name}.weight", path + ("w",), (n_out, n_in), True))
        if bias:
            rows.append((f"{name}.bias", path + ("b",), (n_out,), False))

    def norm(name, path):
        rows.append((f"{name}.weight", path + ("scale",), (D,), False))
        rows.append((f"{name}.bias", path + ("bias",), (D,), False))

    for i in range(cfg.n_layer):
        L = ("layers", i)
        for w in ("wq", "wk", "wv", "wo"):
            linear(f"layers.{i}.attention.{w}", L + ("attn", w), D, D)
        rows.append((f"layers.{i}.attention.q_norm.weight", L + ("attn", "q_norm"), (hd,), False))
        rows.append((f"layers.{i}.attention.k_norm.weight", L + ("attn", "k_norm"), (hd,), False))
        F = cfg.ffn_widths[i]
        linear(f"layers.{i}.feed_forward.w1", L + ("ffn", "w1"), D, F)
        linear(f"layers.{i}.feed_forward.w2", L + ("ffn", "w2"), F, D)
        norm(f"layers.{i}.ffn_norm", L + ("ffn_norm",))
        if i == 0:   # layer 0's q, k, v all read the embedding: one shared norm
            norm("layers.0.attention_norm", L + ("attn_norms", 0))
        else:        # later layers read three different mixed streams: one norm each
            for j in range(3):
                norm(f"layers.{i}.attention_norms.{j}", L + ("attn_norms", j))
        C, S, K = cfg.n_streams(i), cfg.n_sources(i), cfg.da_widths[i]
        rows.append((f"dense_bs.{i}", L + ("da", "bias"), (C, S), False))
        rows.append((f"dynamic_dense.{i}.w1.weight", L + ("da", "w1"), (K, D), True))
        rows.append((f"dynamic_dense.{i}.w2.weight", L + ("da", "w2"), (C * S, K), True))
    norm("norm", ("norm",))
    rows.append(("output.weight", ("lm_head",), (V, D), True))
    return rows


def params_from_table(cfg: Config, leaf):
    """The params pytree with ``leaf(name, path, shape, transpose)`` at every
    :func:`param_table` row (``shape`` is ours: transposed where ``transpose``); layers and
    norm indices become lists."""
    params: dict = {}
    for name, path, shape, transpose in param_table(cfg):
        node = params
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = leaf(name, path, shape[::-1] if transpose else shape, transpose)
    params["layers"] = [params["layers"][i] for i in range(cfg.n_layer)]
    for layer in params["layers"]:
        layer["attn_norms"] = [layer["attn_norms"][j] for j in sorted(layer["attn_norms"])]
    return params


def init(cfg: Config, key):
    """Fresh parameters: weights N(0, 0.02), norms 1, biases 0, and each DA bias 1 on the
    newest source only, so an untrained model starts as a plain residual stack."""
    def leaf(name, path, shape, _):
        if path[-1] in ("scale", "q_norm", "k_norm"):
            return jnp.ones(shape, cfg.dtype)
        if path[-2:] == ("da", "bias"):
            return jnp.zeros(shape, cfg.dtype).at[:, -1].set(1)
        if path[-1] in ("b", "bias"):
            return jnp.zeros(shape, cfg.dtype)
        k = jax.random.fold_in(key, zlib.crc32(name.encode()))
        return (0.02 * jax.random.normal(k, shape)).astype(cfg.dtype)
    return params_from_table(cfg, leaf)


def logical_axes(params):
    """Logical axis names of every parameter (a pytree of PartitionSpec, the LM families'
    names): attention columns ``heads`` and FFN columns ``mlp`` (tensor parallelism), the
    model width ``embed`` (FSDP), the vocabulary ``vocab``; the DA controllers and the
    per-head q/k norms stay whole."""
    P = jax.sharding.PartitionSpec
    by_name = {("wq", "w"): P("embed", "heads"), ("wk", "w"): P("embed", "heads"),
               ("wv", "w"): P("embed", "heads"), ("wo", "w"): P("heads", "embed"),
               ("wq", "b"): P("heads"), ("wk", "b"): P("heads"), ("wv", "b"): P("heads"),
               ("wo", "b"): P("embed"), ("w1", "w"): P("embed", "mlp"),
               ("w2", "w"): P("mlp", "embed"), ("w1", "b"): P("mlp"), ("w2", "b"): P("embed"),
               ("da", "w1"): P("embed", None), ("da", "w2"): P(None, None),
               ("da", "bias"): P(None, None), ("attn", "q_norm"): P(None),
               ("attn", "k_norm"): P(None)}

    def spec(path, leaf):
        names = tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path)
        if names == ("embed",):
            return P("vocab", "embed")
        if names == ("lm_head",):
            return P("embed", "vocab")
        if names[-2:] in by_name:
            return by_name[names[-2:]]
        return P("embed")                     # every LayerNorm's scale and bias
    return jax.tree_util.tree_map_with_path(spec, params)


# --------------------------------------------------------------------------------------------
# Forward pass
# --------------------------------------------------------------------------------------------

def _precision(x):
    # float32 runs at full precision so GPUs do not silently use TF32 (parity needs 1e-5).
    return jax.lax.Precision.HIGHEST if x.dtype == F32 else None


def _linear(x, p):
    y = jnp.matmul(x, p["w"], precision=_precision(x))
    return y + p["b"] if "b" in p else y


def _layer_norm(x, p, eps):
    """LayerNorm with scale and bias; statistics in float32 whatever the compute dtype."""
    x32 = x.astype(F32)
    mu = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mu).mean(-1, keepdims=True)
    y = (x32 - mu) * jax.lax.rsqrt(var + eps)
    return (y * p["scale"].astype(F32) + p["bias"].astype(F32)).astype(x.dtype)


def _rms0(x, eps):
    """RMS normalisation without a scale, in float32."""
    x32 = x.astype(F32)
    return (x32 * jax.lax.rsqrt(jnp.square(x32).mean(-1, keepdims=True) + eps)).astype(x.dtype)


def _gelu(x):
    return jax.nn.gelu(x, approximate=False)   # exact erf form, as upstream


def rope_table(cfg: Config, seq_len: int):
    """cos, sin of t * theta_j, (seq_len, rotary_dims // 2), rounded to float16 like upstream.

    Built with numpy at trace time, so it is a constant of the compiled program.
    """
    r = cfg.rotary_dims
    theta = (1.0 / (np.float32(cfg.rope_base) ** (np.arange(0, r, 2, dtype=np.float32) / r)))
    angles = np.outer(np.arange(seq_len, dtype=np.float32), theta.astype(np.float32))
    cos = np.cos(angles).astype(np.float16).astype(np.float32)
    sin = np.sin(angles).astype(np.float16).astype(np.float32)
    return cos, sin


def _rotary(x, cos, sin, r):
    """GPT-NeoX rotate-half on the first r dims of each head; x is (B, T, H, hd)."""
    h = r // 2
    x32 = x.astype(F32)
    x1, x2, rest = x32[..., :h], x32[..., h:r], x32[..., r:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    rotated = jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, rest], axis=-1)
    return rotated.astype(x.dtype)


def attention(cfg: Config, p, nq, nk, nv, cos, sin):
    """Causal multi-head attention with per-head QK RMS norm (before rotary) and partial rope."""
    B, T, _ = nq.shape
    heads = lambda y: y.reshape(B, T, cfg.n_head, cfg.head_dim)
    q, k, v = heads(_linear(nq, p["wq"])), heads(_linear(nk, p["wk"])), heads(_linear(nv, p["wv"]))
    q = _rms0(q, cfg.norm_eps) * p["q_norm"]
    k = _rms0(k, cfg.norm_eps) * p["k_norm"]
    q, k = _rotary(q, cos, sin, cfg.rotary_dims), _rotary(k, cos, sin, cfg.rotary_dims)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=_precision(q),
                        preferred_element_type=F32) / math.sqrt(cfg.head_dim)
    causal = jnp.tril(jnp.ones((T, T), bool))
    probs = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1).astype(v.dtype)
    y = jnp.einsum("bhqk,bkhd->bqhd", probs, v, precision=_precision(v)).reshape(B, T, cfg.dim)
    return _linear(y, p["wo"])


def block(cfg: Config, p, i: int, streams, cos, sin):
    """Block i: parallel residual on the r stream; q, k, v come from their own streams."""
    x_q, x_k, x_v, x_r = streams
    eps = cfg.norm_eps
    if i == 0:
        n = _layer_norm(x_q, p["attn_norms"][0], eps)
        n_q = n_k = n_v = n
    else:
        n_q, n_k, n_v = (_layer_norm(x, nrm, eps) for x, nrm in zip((x_q, x_k, x_v), p["attn_norms"]))
    attn = attention(cfg, p["attn"], n_q, n_k, n_v, cos, sin)
    ffn = _linear(_gelu(_linear(_layer_norm(x_r, p["ffn_norm"], eps), p["ffn"]["w1"])), p["ffn"]["w2"])
    return x_r + attn + ffn


def da_coefficients(cfg: Config, p, i: int, x):
    """The DA controller after block i: (dynamic, total) coefficients, each (C, B, T, S), f32.

    The MLP reads the raw block output. Its flat output index is stream-major (c * S + s).
    The total adds the static ``dense_bs`` bias; nothing bounds or normalises it.
    """
    B, T, _ = x.shape
    C, S = cfg.n_streams(i), cfg.n_sources(i)
    h = _gelu(jnp.matmul(_rms0(x, cfg.norm_eps), p["w1"], precision=_precision(x)))
    a = jnp.matmul(h, p["w2"], precision=_precision(h)).astype(F32)
    dynamic = a.reshape(B, T, C, S).transpose(2, 0, 1, 3)
    return dynamic, dynamic + p["bias"].astype(F32)[:, None, None, :]


def mix(coef, sources, dtype):
    """Streams c = sum_s coef[c, ..., s] * X_s, accumulated in float32: (C, B, T, D)."""
    out = coef[..., 0, None] * sources[0].astype(F32)[None]
    for s in range(1, len(sources)):
        out = out + coef[..., s, None] * sources[s].astype(F32)[None]
    return out.astype(dtype)


def _check_coeffs(cfg: Config, coeffs, B: int, T: int):
    mixes = coeffs.get("mix") if isinstance(coeffs, Mapping) else None
    if not isinstance(mixes, (list, tuple)) or len(mixes) != cfg.n_layer:
        raise ValueError(f"coeffs must be {{'mix': [one array per layer]}} with {cfg.n_layer} "
                         "layers; pass what the record call returned")
    for i, a in enumerate(mixes):
        want = (cfg.n_streams(i), B, T, cfg.n_sources(i))
        if tuple(np.shape(a)) != want:
            raise ValueError(f"coeffs['mix'][{i}] has shape {tuple(np.shape(a))}, expected {want}")


def static_coefficients(cfg: Config, p, i: int, B: int, T: int):
    """Static mixing after block i: the ``dense_bs`` bias for every token, (C, B, T, S) f32."""
    bias = p["bias"].astype(F32)[:, None, None, :]
    return jnp.broadcast_to(bias, (cfg.n_streams(i), B, T, cfg.n_sources(i)))


def forward(cfg: Config, params, input_ids, coeffs=None, *, static_mixing: bool = False):
    """The full forward pass; returns (logits, coeffs, intermediates).

    ``coeffs`` as :func:`dynjax.coeffs.as_given` takes it. ``intermediates``: ``hidden``
    (X_0..X_L), ``streams`` (the mixed streams after each layer) and ``dynamic`` (the DA
    output without ``dense_bs``; the DA runs in both modes).

    ``static_mixing=True`` is a different program, the model without its DA MLPs (each
    layer mixes by its ``dense_bs`` bias, ``dynamic`` is empty): what fixed mixing executes.
    """
    dt = jnp.dtype(cfg.dtype)
    params = jax.tree.map(lambda a: a.astype(dt), params)
    B, T = input_ids.shape
    if T > cfg.block_size:
        raise ValueError(f"sequence length {T} exceeds block_size {cfg.block_size}")
    if static_mixing and coeffs is not None:
        raise ValueError("static_mixing mixes by the dense_bs biases; pass coeffs=None with it")
    given = coeffs_lib.as_given(coeffs)
    if given.values is not None:
        _check_coeffs(cfg, given.values, B, T)
    cos, sin = rope_table(cfg, T)

    x0 = params["embed"][input_ids]
    sources = [x0]
    streams = (x0, x0, x0, x0)
    used, hidden, mixed, dynamic = [], [x0], [], []
    for i, p in enumerate(params["layers"]):
        x = block(cfg, p, i, streams, cos, sin)
        hidden.append(x)
        if static_mixing:
            coef = static_coefficients(cfg, p["da"], i, B, T)
        else:
            dyn, coef = da_coefficients(cfg, p["da"], i, x)
            dynamic.append(dyn)
            coef = coeffs_lib.site(coef, coeffs_lib.part(given, lambda v, i=i: v["mix"][i]))
        sources = sources + [x]
        out = mix(coef, sources, dt)
        used.append(coef)
        mixed.append(out)
        streams = tuple(out)
    logits = jnp.matmul(_layer_norm(streams[0], params["norm"], cfg.norm_eps), params["lm_head"],
                        precision=_precision(streams[0])).astype(F32)
    inter = {"hidden": hidden, "streams": mixed, "dynamic": dynamic}
    return logits, {"mix": used}, inter


def apply(cfg: Config, params, input_ids, coeffs=None):
    """Record (``coeffs=None``) or replay (``coeffs`` used verbatim; a Given: either).

    Returns ``(logits float32 (B, T, V), {"mix": [A_i (C_i, B, T, S_i) float32]})``.
    """
    logits, used, _ = forward(cfg, params, input_ids, coeffs)
    return logits, used


def apply_static_mixing(cfg: Config, params, input_ids):
    """The same weights with fixed mixing (``forward(static_mixing=True)``): no DA MLP runs.
    Returns ``(logits, {"mix": the biases broadcast to every token})``."""
    logits, used, _ = forward(cfg, params, input_ids, static_mixing=True)
    return logits, used


apply_jit = jax.jit(apply, static_argnums=0)
forward_jit = jax.jit(forward, static_argnums=0)


class MuddPythia:
    """The registry's interface (``dynjax.models.build``) over the functions above."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.schema = schema(cfg)

    def init(self, key, tokens):
        del tokens  # the shapes follow from the config alone
        return init(self.cfg, key)

    def apply(self, params, tokens, coeffs=None):
        return apply(self.cfg, params, tokens, coeffs)

    def logical_axes(self, tokens):
        return logical_axes(jax.eval_shape(self.init, jax.random.key(0), tokens))


# --------------------------------------------------------------------------------------------
# Size estimates
# --------------------------------------------------------------------------------------------

def memory_time_estimate(cfg: Config, n_windows: int, seq_len: int, batch: int,
                         flops_per_second: Optional[float] = None) -> dict:
    """Analytic sizes of an audit over ``n_windows`` windows of ``seq_len`` tokens.

    FLOPs count 2 per multiply-add, attention over the full T x T square as this dense
    implementation computes it. ``activation_bytes_per_batch`` is a rough upper bound of what
    one forward keeps live (all L+1 sources, the float32 streams, scores, FFN hidden, logits).
    A replay forward costs what a record does, the DA MLPs included
    (``replay_flops_per_window`` = ``record_flops_per_window``);
    ``static_mixing_flops_per_window`` is the same model without its DA MLPs (fixed mixing).
    """
    item = jnp.dtype(cfg.dtype).itemsize
    n_params = sum(math.prod(shape) for _, _, shape, _ in param_table(cfg))
    D, T, V, L = cfg.dim, seq_len, cfg.vocab_size, cfg.n_layer
    cs = [cfg.n_streams(i) * cfg.n_sources(i) for i in range(L)]

    per_token_dense = 2 * D * V                                   # lm head
    per_token_da = 0
    for i in range(L):
        per_token_dense += 2 * 4 * D * D + 2 * 2 * D * cfg.ffn_widths[i]   # qkvo + FFN
        per_token_dense += 2 * cs[i] * D                                   # the mix
        per_token_da += 2 * D * cfg.da_widths[i] + 2 * cfg.da_widths[i] * cs[i]
    attn_per_window = L * 2 * 2 * T * T * D                      # q.k and probs.v
    record = T * (per_token_dense + per_token_da) + attn_per_window
    n_batches = -(-n_windows // batch)

    coeff_bytes_per_window = T * sum(cs) * 4                     # float32 cache
    act = batch * T * (
        (L + 1) * D * item                     # sources X_0..X_L stay live for the mixing
        + 4 * D * 4                            # mixed streams, float32 accumulation
        + max(cfg.ffn_widths) * item           # FFN hidden of one layer
        + V * 4)                               # float32 logits
    act += 2 * batch * cfg.n_head * T * T * 4  # float32 scores and probabilities of one layer
    out = {
        "param_count": n_params,
        "param_bytes": n_params * item,
        "coeff_cache_bytes": n_windows * coeff_bytes_per_window,
        "coeff_bytes_per_batch": batch * coeff_bytes_per_window,
        "activation_bytes_per_batch": act,
        "peak_device_bytes_estimate": n_params * item + act + batch * coeff_bytes_per_window,
        "record_flops_per_window": record,
        "replay_flops_per_window": record,
        "static_mixing_flops_per_window": record - T * per_token_da,
        "record_flops_total": record * n_windows,
        "n_batches": n_batches,
    }
    if flops_per_second:
        out["record_seconds_estimate"] = record * n_windows / flops_per_second
    return out
