"""Manifold-constrained hyper-connections (mHC; Xie et al. 2026), DeepSeek-V4's residual.

The residual is ``hc`` parallel streams per token; around each block one hyper-connection
computes, per token, ``pre`` (collapses the streams into the block input), ``post``
(spreads its output back) and ``comb`` (a Sinkhorn doubly stochastic stream mix). All three
pass one coefficient site: replay uses given matrices as they are (no Sinkhorn on replay).
Depth: docs/hf.md#hyper-connections-dynjaxmodelscomponentshyperpy
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from dynjax import coeffs as coeffs_lib
from dynjax.coeffs import Axes

F32 = jnp.float32
PRE_AXES = Axes(("layer", "example", "token", "hc"))
COMB_AXES = Axes(("layer", "example", "token", "hc_in", "hc"))
HEAD_AXES = Axes(("example", "token", "hc"))


@dataclasses.dataclass(frozen=True)
class Dims:
    """One model's hyper-connection settings (hashable: a static jit argument)."""

    hidden_size: int
    hc: int = 4                 # hc_mult: residual streams per token
    sinkhorn_iters: int = 20    # hc_sinkhorn_iters
    eps: float = 1e-6           # hc_eps: the floor in pre, comb and each Sinkhorn sum
    norm_eps: float = 1e-6      # the unweighted RMSNorm of the flattened streams


def rows(dims: Dims, path):
    """(path, shape, logical axes) of one hyper-connection's parameters."""
    n, width = dims.hc, (2 + dims.hc) * dims.hc
    return [(path + ("fn",), (n * dims.hidden_size, width), ("embed", None)),
            (path + ("base",), (width,), (None,)),
            (path + ("scale",), (3,), (None,))]


def head_rows(dims: Dims, path):
    n = dims.hc
    return [(path + ("fn",), (n * dims.hidden_size, n), ("embed", None)),
            (path + ("base",), (n,), (None,)),
            (path + ("scale",), (1,), (None,))]


def _mix_inputs(dims: Dims, fn, h):
    """rms(flatten(h)) @ fn in float32: (B, T, out)."""
    flat = h.reshape(*h.shape[:-2], -1).astype(F32)
    flat = flat * jax.lax.rsqrt(jnp.mean(jnp.square(flat), -1, keepdims=True) + dims.norm_eps)
    return flat @ fn.astype(F32)


def sinkhorn(m, iters: int, eps: float):
    """Columns, then ``iters - 1`` rounds of rows and columns, each divided by its sum + eps
    (m (.., hc_in, hc): rows are hc_in, so a column sum runs over axis -2)."""
    m = m / (jnp.sum(m, -2, keepdims=True) + eps)

    def one(_, m):
        m = m / (jnp.sum(m, -1, keepdims=True) + eps)
        return m / (jnp.sum(m, -2, keepdims=True) + eps)
    return jax.lax.fori_loop(0, iters - 1, one, m)


def weights(dims: Dims, p, h):
    """The controller: {"pre", "post" (B, T, hc), "comb" (B, T, hc, hc)} float32 of h."""
    n = dims.hc
    x = _mix_inputs(dims, p["fn"], h)
    base, scale = p["base"].astype(F32), p["scale"].astype(F32)
    pre = jax.nn.sigmoid(x[..., :n] * scale[0] + base[:n]) + dims.eps
    post = 2 * jax.nn.sigmoid(x[..., n:2 * n] * scale[1] + base[n:2 * n])
    logits = x[..., 2 * n:] * scale[2] + base[2 * n:]
    logits = logits.reshape(*logits.shape[:-1], n, n)
    comb = jax.nn.softmax(logits, axis=-1) + dims.eps
    return {"pre": pre, "post": post, "comb": sinkhorn(comb, dims.sinkhorn_iters, dims.eps)}


def collapse(pre, h):
    """sum_j pre[j] h[j]: the block input (B, T, D) in h's dtype."""
    return jnp.sum(pre[..., None] * h, axis=-2).astype(h.dtype)


def expand(post, comb, h, out):
    """h'[k] = post[k] out + sum_j comb[j, k] h[j] (B, T, hc, D)."""
    dt = h.dtype
    return post.astype(dt)[..., None] * out[..., None, :] + \
        jnp.einsum("btjk,btjd->btkd", comb.astype(dt), h)


def around(dims: Dims, p, h, block, given):
    """One block behind its hyper-connection: (h', the coefficients after their site).
    ``block`` maps the collapsed (B, T, D) input to its (B, T, D) output."""
    used = coeffs_lib.site(weights(dims, p, h), given)
    return expand(used["post"], used["comb"], h, block(collapse(used["pre"], h))), used


def head(dims: Dims, p, h, given):
    """The final collapse: ({"pre": (B, T, hc)} after its site, the (B, T, D) output)."""
    x = _mix_inputs(dims, p["fn"], h)
    pre = jax.nn.sigmoid(x * p["scale"].astype(F32)[0] + p["base"].astype(F32)) + dims.eps
    used = coeffs_lib.site({"pre": pre}, given)
    return collapse(used["pre"], h), used


def expand_embeddings(dims: Dims, x):
    """The embeddings (B, T, D) copied into every stream: (B, T, hc, D)."""
    return jnp.broadcast_to(x[..., None, :], (*x.shape[:-1], dims.hc, x.shape[-1]))
