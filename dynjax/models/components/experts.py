"""Expert MLPs (``Config.experts``; ``dynjax.models.moe_ffn`` runs them). An expert kind is a
namespace of ``rows`` (stacked parameters), ``grouped`` (rows sorted by expert, the
dropless form), ``dense`` (every expert on every token) and ``buffers`` (one-hot expert
buffers); ``EXPERTS[name](cfg)`` binds a kind to a config's constants.

Kinds: "gelu" (the ``moe`` family's), "swiglu" (every port before gpt-oss; also dense
layers and shared experts) and "clamped_swiglu" (gpt-oss).
Depth: docs/moe.md#expert-mlps-dynjaxmodelscomponentsexpertspy
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dynjax.models import dispatch
from dynjax.models import matmul


def mlp_rows(path, d, width, experts=0):
    lead, ax = ((experts,), ("expert",)) if experts else ((), ())
    return [(path + ("gate",), lead + (d, width), ax + ("embed", "mlp")),
            (path + ("up",), lead + (d, width), ax + ("embed", "mlp")),
            (path + ("down",), lead + (width, d), ax + ("mlp", "embed"))]


def gelu_tanh(x):
    """GELU's tanh approximation (transformers' gelu_pytorch_tanh)."""
    return jax.nn.gelu(x, approximate=True)


ACTIVATIONS = {"silu": jax.nn.silu, "gelu_tanh": gelu_tanh}   # Config.hidden_act


def swiglu(p, x, dt, act: str = "silu"):
    """down(act(x gate) * (x up)), act silu (or ``act``, Gemma's gelu_tanh): every dense MLP
    and the shared experts."""
    h = ACTIVATIONS[act](matmul.mm(x, p["gate"].astype(dt))) * matmul.mm(x, p["up"].astype(dt))
    return matmul.mm(h, p["down"].astype(dt))


class Gelu:
    """wo(gelu(x wi)): the moe family's experts (``wi`` (E, d, d_ff), ``wo`` (E, d_ff, d))."""

    def __init__(self, cfg=None):
        del cfg   # no constants

    @staticmethod
    def rows(path, d, width, experts):
        return [(path + ("wi",), (experts, d, width), ("expert", "embed", "mlp")),
                (path + ("wo",), (experts, width, d), ("expert", "mlp", "embed"))]

    @staticmethod
    def grouped(w, rows, groups):
        h = jax.nn.gelu(dispatch.grouped_matmul(rows, w["wi"], groups))
        return dispatch.grouped_matmul(h, w["wo"], groups)

    @staticmethod
    def dense(w, x):
        h = jax.nn.gelu(jnp.einsum("nd,edf->nef", x, w["wi"]))
        return jnp.einsum("nef,efd->ned", h, w["wo"])

    @staticmethod
    def buffers(w, xe, hidden):
        h = hidden(jnp.einsum("becd,edf->becf", xe, w["wi"]))
        return jnp.einsum("becf,efd->becd", jax.nn.gelu(h), w["wo"])


class SwiGLU:
    rows = staticmethod(mlp_rows)

    def __init__(self, cfg=None):
        del cfg   # no constants

    @staticmethod
    def grouped(w, rows, groups):
        mm = lambda a, name: dispatch.grouped_matmul(a, w[name], groups)
        return mm(jax.nn.silu(mm(rows, "gate")) * mm(rows, "up"), "down")

    @staticmethod
    def dense(w, x):
        h = jax.nn.silu(jnp.einsum("nd,edf->nef", x, w["gate"])) * \
            jnp.einsum("nd,edf->nef", x, w["up"])
        return jnp.einsum("nef,efd->ned", h, w["down"])

    @staticmethod
    def buffers(w, xe, hidden):
        mm = lambda a, name: jnp.einsum("becd,edf->becf", a, w[name])
        return mm(hidden(jax.nn.silu(mm(xe, "gate")) * mm(xe, "up")), "down")


def clamped_glu(gate, up, limit: float, alpha: float = 1.0, up_offset: float = 0.0):
    """The clamped SwiGLU activation: (clip(up, -limit, limit) + up_offset) g sigmoid(alpha g),
    g = min(gate, limit). gpt-oss: alpha 1.702, offset 1; DeepSeek-V4 (experts and shared
    expert): alpha 1, offset 0, i.e. silu(min(gate, limit)) clip(up)."""
    gate = jnp.minimum(gate, limit)
    up = jnp.clip(up, -limit, limit)
    if up_offset:
        up = up + up_offset
    return up * (gate * jax.nn.sigmoid(gate * alpha))


class ClampedSwiGLU:
    """gpt-oss's experts: interleaved gate/up with biases, clamped SwiGLU, down with bias."""

    def __init__(self, cfg):
        self.limit, self.alpha = cfg.swiglu_limit, cfg.swiglu_alpha

    @staticmethod
    def rows(path, d, width, experts):
        return [(path + ("gate_up",), (experts, d, 2 * width), ("expert", "embed", "mlp")),
                (path + ("gate_up_bias",), (experts, 2 * width), ("expert", "mlp")),
                (path + ("down",), (experts, width, d), ("expert", "mlp", "embed")),
                (path + ("down_bias",), (experts, d), ("expert", "embed"))]

    def glu(self, h):
        return clamped_glu(h[..., 0::2], h[..., 1::2], self.limit, self.alpha, 1.0)

    def grouped(self, w, rows, groups):
        e = groups.row_expert
        h = dispatch.grouped_matmul(rows, w["gate_up"], groups) + w["gate_up_bias"][e]
        return dispatch.grouped_matmul(self.glu(h), w["down"], groups) + w["down_bias"][e]

    def dense(self, w, x):
        h = jnp.einsum("nd,edf->nef", x, w["gate_up"]) + w["gate_up_bias"]
        return jnp.einsum("nef,efd->ned", self.glu(h), w["down"]) + w["down_bias"]

    def buffers(self, w, xe, hidden):
        h = jnp.einsum("becd,edf->becf", xe, w["gate_up"]) + w["gate_up_bias"][:, None]
        return jnp.einsum("becf,efd->becd", hidden(self.glu(h)), w["down"]) + \
            w["down_bias"][:, None]


class GeGLU:
    """"geglu", Gemma-4's experts: down(gelu_tanh(x W_gate) * (x W_up)), no biases, gate and
    up one stacked weight ``gate_up`` (expert, embed, 2 x width), the gate in the first half
    (the checkpoint's ``gate_up_proj``)."""

    def __init__(self, cfg=None):
        del cfg   # no constants

    @staticmethod
    def rows(path, d, width, experts):
        return [(path + ("gate_up",), (experts, d, 2 * width), ("expert", "embed", "mlp")),
                (path + ("down",), (experts, width, d), ("expert", "mlp", "embed"))]

    @staticmethod
    def glu(h):
        gate, up = jnp.split(h, 2, axis=-1)
        return gelu_tanh(gate) * up

    def grouped(self, w, rows, groups):
        h = dispatch.grouped_matmul(rows, w["gate_up"], groups)
        return dispatch.grouped_matmul(self.glu(h), w["down"], groups)

    def dense(self, w, x):
        h = jnp.einsum("nd,edf->nef", x, w["gate_up"])
        return jnp.einsum("nef,efd->ned", self.glu(h), w["down"])

    def buffers(self, w, xe, hidden):
        h = jnp.einsum("becd,edf->becf", xe, w["gate_up"])
        return jnp.einsum("becf,efd->becd", hidden(self.glu(h)), w["down"])


EXPERTS = {"gelu": Gelu, "swiglu": SwiGLU, "clamped_swiglu": ClampedSwiGLU, "geglu": GeGLU}
