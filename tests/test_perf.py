"""CPU speed-ups that must not change results: per-token projections are bitwise neutral
for training; block-causal attention equals the full T x T form within float tolerance."""
import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dynjax.models import build, mudd, transformer
from dynjax.models.transformer import ModelConfig, causal_attention
from dynjax.train.loop import make_train_step

B, T = 2, 32
BASE = dict(d_model=32, n_heads=2, n_layers=2, d_ff=64, attn_block=8)
# MoD at k = 8 routed tokens per example: at k <= 4 XLA:CPU's tiny-matmul emitter sums the
# 3-D form's weight gradient in another order (1 ulp), so the two forms differ there.
FAMILIES = [("gates", "feature_gate", {}), ("mod", "mod", {"mod_capacity": 0.25}),
            ("moe", "moe", {}), ("mudd", "mudd", {})]


def tokens(seed=0):
    return jax.random.randint(jax.random.key(seed), (B, T), 0, 256)


def cfg_of(family, variant, **kw):
    return ModelConfig(family=family, variant=variant, **{**BASE, **kw})


def train(cfg, steps=2):
    model = build(cfg)
    params = model.init(jax.random.key(0), tokens())
    tx = optax.adamw(1e-2)
    step = jax.jit(make_train_step(model, tx))
    state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}
    for i in range(steps):
        state, _ = step(state, tokens(i))
    return state["params"]


@pytest.mark.parametrize("family,variant,extra", FAMILIES)
def test_per_token_projections_train_bitwise_like_3d(family, variant, extra, monkeypatch):
    cfg = cfg_of(family, variant, **extra)
    flat = train(cfg)
    unflat = lambda layer, x: layer(x)  # the (B, T, ...) form the projections had before
    monkeypatch.setattr(transformer, "per_token", unflat)
    monkeypatch.setattr(mudd, "per_token", unflat)
    chex.assert_trees_all_equal(flat, train(cfg))


def test_block_causal_attention_equals_full():
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (B, T, 2, 8)) for key in (kq, kk, kv))
    plain = jnp.broadcast_to(jnp.arange(T), (B, T))
    # MoD's gathered tokens: original positions in order, unused slots at EMPTY (discarded)
    gathered = jnp.sort(jax.random.choice(jax.random.key(1), 4 * T, (T,), replace=False))
    gathered = jnp.broadcast_to(jnp.where(jnp.arange(T) % 7 == 3, 2 ** 30, gathered), (B, T))
    for pos in (plain, gathered):
        full_out, full_lse, _ = causal_attention(q, k, v, pos, pos, 0)
        out, lse, _ = causal_attention(q, k, v, pos, pos, 8)
        real = (pos < 2 ** 30)[:, :, None, None]
        np.testing.assert_allclose(jnp.where(real, out, 0), jnp.where(real, full_out, 0),
                                   atol=1e-5)
        np.testing.assert_allclose(jnp.where(real[:, None, :, 0, 0], lse, 0),
                                   jnp.where(real[:, None, :, 0, 0], full_lse, 0), atol=1e-5)


@pytest.mark.parametrize("family,variant,extra", [  # MoD's causal route leaves unused slots
    ("gates", "feature_gate", {}), ("mod", "mod", {"mod_route": "router", "mod_capacity": 0.5}),
    ("mudd", "mudd", {})])
def test_block_causal_models_equal_full(family, variant, extra):
    cfg = cfg_of(family, variant, **extra)
    model = build(cfg)
    params = model.init(jax.random.key(0), tokens())
    full = build(dataclasses.replace(cfg, attn_block=0))

    def loss(m):
        return lambda p: (m.apply(p, tokens())[0] ** 2).mean()
    (got, coeffs), (want, want_coeffs) = (jax.jit(m.apply)(params, tokens())
                                          for m in (model, full))
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
    chex.assert_trees_all_close(coeffs, want_coeffs, atol=2e-5, rtol=2e-5)
    if family == "gates":  # the backward pass too
        chex.assert_trees_all_close(jax.jit(jax.grad(loss(model)))(params),
                                    jax.jit(jax.grad(loss(full)))(params), atol=2e-5, rtol=2e-4)
