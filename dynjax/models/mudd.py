"""MUDD family: a dynjax decoder whose blocks read a dynamic dense mix of all earlier layers.

A trainable, tiny-scale sibling of MUDDPythia (``dynjax.models.muddpythia``) built from the
dynjax core (sequential residual; with its initial bias it *is* a plain pre-norm decoder),
so a MUDD model can be trained in-project and audited beside FeatureGate. Variants ``mudd``
(a DA MLP's per-token mix) and ``mudd_static`` (the bias only); coefficients ``{"mix": ..}``
with MUDDPythia's schema. Layers are always unrolled (each has its own source count).
Depth: docs/models.md#the-trainable-mudd-family-dynjaxmodelsmuddpy
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from dynjax import coeffs as coeffs_lib
from dynjax.coeffs import Axes
from dynjax.models.muddpythia import mix
from dynjax.models.transformer import (Head, Mlp, ModelConfig, causal_attention, dense_init,
                                       embed_tokens, norm, out_projection, per_token,
                                       project_qkv)

VARIANTS = ("mudd", "mudd_static")
MIX_AXES = Axes(("stream", "example", "token", "source"))


def n_streams(cfg: ModelConfig, i: int) -> int:
    """C_i: streams fed by the mix after block i (q, k, v, r; one before the head)."""
    return 4 if i < cfg.n_layers - 1 else 1


def schema(cfg: ModelConfig):
    """One (stream, example, token, source) leaf per layer, exactly as MUDDPythia."""
    return {"mix": [MIX_AXES for _ in range(cfg.n_layers)]}


class StreamAttention(nn.Module):
    """Causal rotary attention whose queries, keys and values come from three inputs."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, xq, xk, xv, positions):
        cfg = self.cfg
        q, k, v = project_qkv(cfg, xq, xk, xv, positions, positions)
        out, _, _ = causal_attention(q, k, v, positions.index, positions.index, cfg.attn_block)
        return per_token(out_projection(cfg), out)


class MuddBlock(nn.Module):
    """Pre-norm block over four streams; returns the new hidden state X_{i+1}."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, streams, positions):
        cfg = self.cfg
        xq, xk, xv, xr = streams
        a = StreamAttention(cfg, name="attn")(norm("q_norm", cfg)(xq), norm("k_norm", cfg)(xk),
                                              norm("v_norm", cfg)(xv), positions)
        h = xr + a
        return h + Mlp(cfg, name="mlp")(norm("mlp_norm", cfg)(h))


class DynamicDense(nn.Module):
    """The DA controller MLP: normalised X_{i+1} (B, T, D) -> coefficients (C, B, T, S), f32."""

    cfg: ModelConfig
    n_streams: int
    n_sources: int

    @nn.compact
    def __call__(self, nx):
        cfg, C, S = self.cfg, self.n_streams, self.n_sources
        z = per_token(nn.Dense(cfg.mudd.da_hidden, use_bias=False, dtype=cfg.compute_dtype,
                               kernel_init=dense_init(("embed", None)), name="hidden"), nx)
        a = per_token(nn.Dense(C * S, use_bias=False, dtype=cfg.compute_dtype, name="out",
                               kernel_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                                                        (None, None))),
                      nn.gelu(z))
        B, T, _ = nx.shape
        return a.astype(jnp.float32).reshape(B, T, C, S).transpose(2, 0, 1, 3)  # stream-major


def _newest_source_init(key, shape, dtype=jnp.float32):
    """Static bias start: every stream copies the newest source (a plain residual network)."""
    return jnp.zeros(shape, dtype).at[:, -1].set(1.0)


class MuddLayer(nn.Module):
    """Block ``index`` plus the mix after it.

    ``given``: this layer's :class:`~dynjax.coeffs.Given` ((C, B, T, S) values or None).
    Returns the next streams, the sources X_0 .. X_{i+1} and the coefficients used.
    """

    cfg: ModelConfig
    index: int

    @nn.compact
    def __call__(self, streams, sources, positions, given):
        cfg = self.cfg
        C, S = n_streams(cfg, self.index), self.index + 2
        x = MuddBlock(cfg, name="block")(streams, positions)
        bias = self.param("static_bias", nn.with_logical_partitioning(
            _newest_source_init, (None, None)), (C, S))
        if cfg.variant == "mudd":
            coef = DynamicDense(cfg, C, S, name="da")(norm("da_norm", cfg)(x))
            coef = coef + bias[:, None, None, :]
        else:  # mudd_static: the bias is the coefficient
            coef = jnp.broadcast_to(bias[:, None, None, :], (C,) + x.shape[:2] + (S,))
        coef = coeffs_lib.site(coef.astype(jnp.float32), given)
        # Not for replay (one program either way): without this barrier XLA:CPU fuses the
        # static variant's broadcast bias into the mix and its training moves in the last
        # bits, so it stays to keep behaviour bitwise (scripts/check_digests.py).
        coef, sources = jax.lax.optimization_barrier((coef, sources + [x]))
        return tuple(mix(coef, sources, cfg.compute_dtype)), sources, coef


class MuddDecoder(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens, given=None):
        """``given``: a :class:`~dynjax.coeffs.Given` of ``{"mix": [...]}`` or None."""
        cfg = self.cfg
        x0, positions = embed_tokens(cfg, tokens)
        streams, sources, used = (x0,) * 4, [x0], []
        layer_cls = nn.remat(MuddLayer) if cfg.remat else MuddLayer
        for i in range(cfg.n_layers):
            layer_given = coeffs_lib.part(given, lambda v, i=i: v["mix"][i])
            streams, sources, coef = layer_cls(cfg, i, name=f"layer_{i}")(
                streams, sources, positions, layer_given)
            used.append(coef)
        return Head(cfg, name="head")(streams[0]), {"mix": used}
