"""Sharding constraints on activations, by logical axis name, active only under a mesh.

Activations carry logical axis names through :func:`constrain`, so that under a rules
preset XLA keeps the big intermediates split the way the weights are instead of choosing
(and sometimes replicating) on its own. Off by default: only a function wrapped by
:func:`traced_under` (before ``jax.jit``) gets them, so every other program is unchanged.
Depth: docs/multihost.md#activation-constraints-dynjaxmodelsactivation_shardingpy
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

import flax.linen as nn

_ACTIVE = contextvars.ContextVar("dynjax_activation_sharding", default=None)

# the logical axes of the arrays every family shares
TOKENS = ("batch", "length", "embed")           # hidden states, block updates (B, T, D)
HEADS = ("batch", "length", "heads", "kv")      # queries, keys, values (B, T, H, Dh)
HIDDEN = ("batch", "length", "mlp")             # the MLP's hidden layer (B, T, F)
LOGITS = ("batch", "length", "vocab")           # the head's output (B, T, V)
BUFFERS = ("batch", "expert", None, "embed")     # MoE expert buffers (B, E, C, D)
BUFFER_HIDDEN = ("batch", "expert", None, "mlp")  # and their hidden layer (B, E, C, F)


def constrain(x, axes):
    """``x`` constrained to the mesh axes its logical ``axes`` map to, inside
    :func:`activation_sharding`; ``x`` itself elsewhere."""
    active = _ACTIVE.get()
    if active is None:
        return x
    mesh, rules = active
    return nn.with_logical_constraint(x, axes, rules=rules, mesh=mesh)


def active():
    """``(mesh, rules)`` while tracing inside :func:`activation_sharding`, else None."""
    return _ACTIVE.get()


@contextlib.contextmanager
def activation_sharding(mesh, rules):
    """Within this context :func:`constrain` applies ``rules`` over ``mesh``."""
    rules = tuple((name, tuple(axis) if isinstance(axis, list) else axis)  # JSON lists
                  for name, axis in rules)
    token = _ACTIVE.set((mesh, rules))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def traced_under(fn, mesh, rules):
    """``fn`` whose tracing runs inside ``activation_sharding(mesh, rules)``; ``fn``
    unchanged on a one-device mesh, where a constraint could only cost."""
    if mesh.size == 1:
        return fn

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with activation_sharding(mesh, rules):
            return fn(*args, **kwargs)

    return wrapped
