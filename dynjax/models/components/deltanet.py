"""Gated DeltaNet (Yang, Kautz and Hatamizadeh 2024): the linear-attention token mixer of
Qwen3-Next and Qwen3.5, as one component a port composes.

A gated delta-rule state update per value head, after a causal depthwise conv and SiLU,
with a SiLU-gated RMSNorm on the output. The forward runs the chunked form (UT transform
within chunks, a ``lax.scan`` across them: linear in T); the per-token recurrence is the
tests' reference and the decoding step. ``beta`` and the log decay are coefficient sites.
Depth: docs/hf.md#gated-deltanet-dynjaxmodelscomponentsdeltanetpy
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dynjax import coeffs as coeffs_lib
from dynjax.coeffs import Axes

F32 = jnp.float32
HEAD_AXES = Axes(("layer", "example", "token", "head"))
SCHEMA = {"deltanet_beta": HEAD_AXES, "deltanet_decay": HEAD_AXES}
L2_EPS = 1e-6   # fla's and transformers' l2norm epsilon (inside the square root)


@dataclasses.dataclass(frozen=True)
class Dims:
    """The sizes of one Gated DeltaNet layer (hashable: a static jit argument)."""

    hidden_size: int
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int = 4
    rms_norm_eps: float = 1e-6
    chunk_size: int = 64

    def __post_init__(self):
        if self.value_heads % self.key_heads:
            raise ValueError(f"deltanet: value_heads={self.value_heads} must be a multiple of "
                             f"key_heads={self.key_heads}")
        if self.conv_kernel < 1 or self.chunk_size < 1:
            raise ValueError(f"deltanet: conv_kernel={self.conv_kernel} and chunk_size="
                             f"{self.chunk_size} must be >= 1")


class State(NamedTuple):
    """A layer's decoding state: the last K-1 conv inputs of q, k, v (B, K-1, heads, dim)
    and the recurrent matrix (B, Hv, dk, dv), float32."""

    conv_q: jax.Array
    conv_k: jax.Array
    conv_v: jax.Array
    recurrent: jax.Array


def param_rows(dims: Dims, path: tuple):
    """(path, shape, logical axes) of one layer's parameters, for a port's param table."""
    D, Hk, Hv, dk, dv, K = (dims.hidden_size, dims.key_heads, dims.value_heads,
                            dims.key_dim, dims.value_dim, dims.conv_kernel)
    heads = ("embed", "heads", "kv")
    return [(path + ("q",), (D, Hk, dk), heads), (path + ("k",), (D, Hk, dk), heads),
            (path + ("v",), (D, Hv, dv), heads), (path + ("z",), (D, Hv, dv), heads),
            (path + ("b",), (D, Hv), ("embed", "heads")),
            (path + ("a",), (D, Hv), ("embed", "heads")),
            (path + ("conv_q",), (K, Hk, dk), (None, "heads", "kv")),
            (path + ("conv_k",), (K, Hk, dk), (None, "heads", "kv")),
            (path + ("conv_v",), (K, Hv, dv), (None, "heads", "kv")),
            (path + ("dt_bias",), (Hv,), ("heads",)), (path + ("A_log",), (Hv,), ("heads",)),
            (path + ("norm",), (dv,), ("kv",)), (path + ("out",), (Hv, dv, D),
                                                 ("heads", "kv", "embed"))]


def initial_state(dims: Dims, batch: int, dtype=F32) -> State:
    """Zeros: the state before the first token."""
    K = dims.conv_kernel - 1
    return State(jnp.zeros((batch, K, dims.key_heads, dims.key_dim), dtype),
                 jnp.zeros((batch, K, dims.key_heads, dims.key_dim), dtype),
                 jnp.zeros((batch, K, dims.value_heads, dims.value_dim), dtype),
                 jnp.zeros((batch, dims.value_heads, dims.key_dim, dims.value_dim), F32))


# --------------------------------------------------------------------------------- pieces

def causal_conv(x, w, state):
    """Causal depthwise conv1d of x (B, T, *C) with kernel w (K, *C): y_t = sum_j w_j
    x_{t-K+1+j}, the K-1 inputs before the first token read from ``state`` (B, K-1, *C).
    Returns (y, the new state: the last K-1 inputs)."""
    K, T = w.shape[0], x.shape[1]
    xs = jnp.concatenate([state.astype(x.dtype), x], axis=1)
    y = sum(w[j].astype(x.dtype) * xs[:, j:j + T] for j in range(K))
    return y, xs[:, xs.shape[1] - (K - 1):]


def l2_normalize(x, eps=L2_EPS):
    """x / sqrt(|x|^2 + eps) over the last axis (fla's and transformers' form)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def gated_rms_norm(x, z, w, eps):
    """RMSNorm of x (statistics in float32, cast back, times w), then times SiLU(z)."""
    x32 = x.astype(F32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    y = w * y.astype(x.dtype)
    return (y * jax.nn.silu(z.astype(F32))).astype(x.dtype)


def decay_and_beta(p, x):
    """The layer's coefficients from its input x (B, T, D): beta = sigmoid(x W_b) and the
    log decay g = -exp(A_log) softplus(x W_a + dt_bias), each (B, T, Hv) float32."""
    b = x @ p["b"].astype(x.dtype)
    a = x @ p["a"].astype(x.dtype)
    g = -jnp.exp(p["A_log"].astype(F32)) * jax.nn.softplus(a.astype(F32) + p["dt_bias"])
    return {"deltanet_beta": jax.nn.sigmoid(b).astype(F32), "deltanet_decay": g}


# ------------------------------------------------------------------------ the delta rule

def delta_rule_recurrent(q, k, v, g, beta, state):
    """The gated delta rule token by token: q, k (B, T, H, dk) normalised and scaled, v
    (B, T, H, dv), g, beta (B, T, H), state (B, H, dk, dv); all float32.
    Returns (o (B, T, H, dv), the final state)."""
    def step(S, inputs):
        q_t, k_t, v_t, g_t, b_t = inputs
        S = S * jnp.exp(g_t)[..., None, None]
        predicted = jnp.einsum("bhkv,bhk->bhv", S, k_t)
        S = S + jnp.einsum("bhk,bhv->bhkv", k_t, b_t[..., None] * (v_t - predicted))
        return S, jnp.einsum("bhkv,bhk->bhv", S, q_t)
    time_major = [jnp.moveaxis(a, 1, 0) for a in (q, k, v, g, beta)]
    state, o = jax.lax.scan(step, state, time_major)
    return jnp.moveaxis(o, 0, 1), state


def delta_rule_chunked(q, k, v, g, beta, state, chunk_size):
    """The same rule chunk by chunk (same arguments and result as
    :func:`delta_rule_recurrent`). T is padded to a multiple of ``chunk_size`` with tokens
    that change nothing (k = v = 0, g = 0, beta = 0), so the final state is exact.

    Within a chunk (positions i, j; c_i the cumulative log decay from the chunk's start):
    A_ij = beta_i k_i.k_j exp(c_i - c_j) for j < i; (I + A) U = beta v and
    (I + A) W = beta k exp(c) (the UT transform); then with the incoming state S,
    v' = U - W S,  o = (q exp(c)) S + [(q k^T) exp(c_i - c_j)]_{j<=i} v',
    S <- exp(c_C) S + (k exp(c_C - c))^T v'."""
    B, T, H, dk = q.shape
    C = chunk_size
    pad = -T % C
    n = (T + pad) // C

    def chunks(a):   # (B, T, H, ...) -> (B, H, n, C, ...)
        a = jnp.pad(a, [(0, 0), (0, pad)] + [(0, 0)] * (a.ndim - 2))
        a = a.reshape((B, n, C) + a.shape[2:])
        return jnp.moveaxis(a, 3, 1)
    q, k, v, g, beta = (chunks(a) for a in (q, k, v, g, beta))
    c = jnp.cumsum(g, axis=-1)                                       # (B, H, n, C)
    lower = jnp.tril(jnp.ones((C, C), bool))
    diff = jnp.where(lower, c[..., :, None] - c[..., None, :], -jnp.inf)
    decay = jnp.exp(diff)                                            # 0 above the diagonal
    kk = jnp.einsum("bhnik,bhnjk->bhnij", k, k)
    A = jnp.where(jnp.tril(lower, -1), beta[..., :, None] * kk * decay, 0.0)
    system = A + jnp.eye(C, dtype=A.dtype)
    solve = lambda rhs: jax.scipy.linalg.solve_triangular(system, rhs, lower=True,
                                                          unit_diagonal=True)
    U = solve(beta[..., None] * v)
    W = solve(beta[..., None] * k * jnp.exp(c)[..., None])
    attn = jnp.einsum("bhnik,bhnjk->bhnij", q, k) * decay
    q_decayed = q * jnp.exp(c)[..., None]
    k_decayed = k * jnp.exp(c[..., -1:] - c)[..., None]
    chunk_decay = jnp.exp(c[..., -1])                                # (B, H, n)

    def step(S, xs):
        U_c, W_c, attn_c, q_c, k_c, d_c = xs
        v_new = U_c - jnp.einsum("bhik,bhkv->bhiv", W_c, S)
        o = jnp.einsum("bhik,bhkv->bhiv", q_c, S) + jnp.einsum("bhij,bhjv->bhiv", attn_c, v_new)
        S = S * d_c[..., None, None] + jnp.einsum("bhik,bhiv->bhkv", k_c, v_new)
        return S, o
    per_chunk = [jnp.moveaxis(a, 2, 0) for a in (U, W, attn, q_decayed, k_decayed, chunk_decay)]
    state, o = jax.lax.scan(step, state, per_chunk)                  # o (n, B, H, C, dv)
    o = jnp.moveaxis(o, 0, 2).reshape(B, H, n * C, -1)[:, :, :T]
    return jnp.moveaxis(o, 1, 2), state


def delta_rule(q, k, v, g, beta, state, chunk_size):
    """The gated delta rule on raw (conv'd) q, k: L2-normalised, q scaled by dk^-1/2, each
    q/k head repeated over its value heads, float32; the chunked form for T > 1, one
    recurrent step for T = 1 (decoding). Returns (o (B, T, Hv, dv) float32, state)."""
    group = v.shape[2] // q.shape[2]
    q, k = (jnp.repeat(l2_normalize(a.astype(F32)), group, axis=2) for a in (q, k))
    q = q * (q.shape[-1] ** -0.5)
    args = (q, k, v.astype(F32), g.astype(F32), beta.astype(F32), state.astype(F32))
    if q.shape[1] == 1:
        return delta_rule_recurrent(*args)
    return delta_rule_chunked(*args, chunk_size)


# ------------------------------------------------------------------------------ the layer

def mix(dims: Dims, p, x, given=None, state: State | None = None):
    """One Gated DeltaNet token mixer on x (B, T, D), already normed.

    Returns (y (B, T, D), {"deltanet_beta", "deltanet_decay"} after their site, the new
    :class:`State`). ``given`` selects recorded or computed coefficients
    (:func:`dynjax.coeffs.site`); ``state`` continues a sequence (None: it starts here)."""
    B, T, _ = x.shape
    dt = x.dtype
    if state is None:
        state = initial_state(dims, B, dt)
    proj = lambda name: jnp.einsum("btd,dhk->bthk", x, p[name].astype(dt))
    convolved = [causal_conv(proj(name), p["conv_" + name], prev)
                 for name, prev in (("q", state.conv_q), ("k", state.conv_k),
                                    ("v", state.conv_v))]
    q, k, v = (jax.nn.silu(y) for y, _ in convolved)
    used = coeffs_lib.site(decay_and_beta(p, x), given)
    o, recurrent = delta_rule(q, k, v, used["deltanet_decay"], used["deltanet_beta"],
                              state.recurrent, dims.chunk_size)
    o = gated_rms_norm(o.astype(dt), proj("z"), p["norm"].astype(dt), dims.rms_norm_eps)
    y = jnp.einsum("bthv,hvd->btd", o, p["out"].astype(dt))
    return y, used, State(*(s for _, s in convolved), recurrent)


# ------------------------------------------------------- checkpoint layouts (transformers)

NAMES = ("q", "k", "v", "z", "b", "a", "conv_q", "conv_k", "conv_v", "dt_bias", "A_log",
         "norm", "out")


def _shared_tensor(dims: Dims, get, name):
    """The parameters both layouts store alike: the conv kernel (channels q | k | v), the
    decay's A_log and dt_bias, the gated norm and the output projection. ``get(hf_name)``
    reads a tensor by transformers' name inside the layer."""
    Hk, Hv, dk, dv = dims.key_heads, dims.value_heads, dims.key_dim, dims.value_dim
    if name.startswith("conv_"):
        conv = get("conv1d.weight")[:, 0, :].T                          # (K, channels)
        qk = Hk * dk
        part = {"conv_q": (0, qk, Hk, dk), "conv_k": (qk, 2 * qk, Hk, dk),
                "conv_v": (2 * qk, None, Hv, dv)}[name]
        return conv[:, part[0]:part[1]].reshape(-1, part[2], part[3])
    if name == "out":
        return get("out_proj.weight").T.reshape(Hv, dv, dims.hidden_size)
    return get({"dt_bias": "dt_bias", "A_log": "A_log", "norm": "norm.weight"}[name])


def qwen3_next_tensor(dims: Dims, get, name):
    """Param ``name`` of one layer from Qwen3-Next's fused projections: ``in_proj_qkvz``
    holds, per key head, [q, k, the v of its value heads, their z]; ``in_proj_ba`` [b, a]."""
    D, Hk, Hv, dk, dv = (dims.hidden_size, dims.key_heads, dims.value_heads, dims.key_dim,
                         dims.value_dim)
    r = Hv // Hk
    if name in ("q", "k", "v", "z"):
        qkvz = get("in_proj_qkvz.weight").T.reshape(D, Hk, 2 * dk + 2 * r * dv)
        start = {"q": 0, "k": dk, "v": 2 * dk, "z": 2 * dk + r * dv}[name]
        if name in ("q", "k"):
            return qkvz[..., start:start + dk]
        return qkvz[..., start:start + r * dv].reshape(D, Hv, dv)
    if name in ("b", "a"):
        ba = get("in_proj_ba.weight").T.reshape(D, Hk, 2 * r)
        return (ba[..., :r] if name == "b" else ba[..., r:]).reshape(D, Hv)
    return _shared_tensor(dims, get, name)


def qwen3_5_tensor(dims: Dims, get, name):
    """Param ``name`` of one layer from Qwen3.5's separate ``in_proj_qkv`` (rows q | k | v),
    ``in_proj_z``, ``in_proj_b`` and ``in_proj_a``."""
    D, Hk, Hv, dk, dv = (dims.hidden_size, dims.key_heads, dims.value_heads, dims.key_dim,
                         dims.value_dim)
    if name in ("q", "k", "v"):
        qkv = get("in_proj_qkv.weight").T
        start, heads, dim = {"q": (0, Hk, dk), "k": (Hk * dk, Hk, dk),
                             "v": (2 * Hk * dk, Hv, dv)}[name]
        return qkv[:, start:start + heads * dim].reshape(D, heads, dim)
    if name == "z":
        return get("in_proj_z.weight").T.reshape(D, Hv, dv)
    if name in ("b", "a"):
        return get(f"in_proj_{name}.weight").T
    return _shared_tensor(dims, get, name)


def from_qwen3_next(dims: Dims, t):
    """One layer's params from a mapping of transformers' names (Qwen3-Next's layout)."""
    return {name: qwen3_next_tensor(dims, t.__getitem__, name) for name in NAMES}


def from_qwen3_5(dims: Dims, t):
    """One layer's params from a mapping of transformers' names (Qwen3.5's layout)."""
    return {name: qwen3_5_tensor(dims, t.__getitem__, name) for name in NAMES}
