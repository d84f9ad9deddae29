"""DeepSeek-V4's own pieces against transformers' modules (tests/data/deepseek_v4_parts.npz,
made by scripts/make_deepseek_v4_reference.py; no torch needed): manifold-constrained
hyper-connections (pre, post, Sinkhorn comb, the layer's mix, the head), and their
coefficient sites recording and replaying bitwise in one compiled program."""
from __future__ import annotations

import functools
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np

from dynjax import coeffs as coeffs_lib
from dynjax.models.components import hyper

REFERENCE = pathlib.Path(__file__).parent / "data" / "deepseek_v4_parts.npz"
DIMS = hyper.Dims(hidden_size=16, hc=4, sinkhorn_iters=20, eps=1e-6, norm_eps=1e-6)


@functools.lru_cache(maxsize=None)
def reference():
    data = dict(np.load(REFERENCE))
    hc = {"fn": data["hc.fn"].T, "base": data["hc.base"], "scale": data["hc.scale"]}
    head = {"fn": data["head.fn"].T, "base": data["head.base"], "scale": data["head.scale"]}
    return data, jax.tree.map(jnp.asarray, hc), jax.tree.map(jnp.asarray, head)


def block(x):
    """A stand-in block whose output depends on its input (so pre matters downstream)."""
    return jnp.tanh(x) * 1.5


@jax.jit
def around(p, h, given):
    return hyper.around(DIMS, p, h, block, given)


def test_hyper_connection_equals_transformers():
    """pre/post/comb, the collapsed input and the mixed streams of one decoder site."""
    data, p, _ = reference()
    w = jax.jit(functools.partial(hyper.weights, DIMS))(p, jnp.asarray(data["hc.h"]))
    np.testing.assert_allclose(w["post"], data["hc.post"], rtol=0, atol=2e-6)
    np.testing.assert_allclose(w["comb"], data["hc.comb"], rtol=0, atol=2e-6)
    np.testing.assert_allclose(hyper.collapse(w["pre"], jnp.asarray(data["hc.h"])),
                               data["hc.collapsed"], rtol=0, atol=2e-6)
    mixed = hyper.expand(w["post"], w["comb"], jnp.asarray(data["hc.h"]),
                         jnp.asarray(data["hc.out"]))
    np.testing.assert_allclose(mixed, data["hc.mixed"], rtol=0, atol=5e-6)
    # the fixture is not degenerate: coefficients vary by token, comb is far from uniform
    assert float(jnp.std(w["post"], axis=(0, 1)).min()) > 0.05
    assert float(jnp.abs(w["comb"] - 0.25).max()) > 0.2


def test_comb_is_doubly_stochastic():
    """Columns sum to 1 (Sinkhorn ends on them); rows nearly (20 iterations on sharp
    softmaxes leave this fixture's rows within 0.05, as transformers' do)."""
    data, p, _ = reference()
    comb = hyper.weights(DIMS, p, jnp.asarray(data["hc.h"]))["comb"]
    np.testing.assert_allclose(comb.sum(-2), 1.0, atol=1e-5)
    np.testing.assert_allclose(comb.sum(-1), 1.0, atol=0.06)
    np.testing.assert_allclose(data["hc.comb"].sum(-1), 1.0, atol=0.06)
    assert float(comb.min()) >= 0


def test_head_equals_transformers():
    data, _, head = reference()
    y, used = jax.jit(functools.partial(hyper.head, DIMS))(head, jnp.asarray(data["hc.h"]), None)
    np.testing.assert_allclose(y, data["head.y"], rtol=0, atol=2e-6)
    assert used["pre"].shape == (2, 7, 4)


def test_sites_record_and_replay_bitwise():
    """Record, replay the record (bitwise), and replay edited matrices: the given comb is
    applied as is (no Sinkhorn on replay), in the same compiled program."""
    data, p, _ = reference()
    h = jnp.asarray(data["hc.h"])
    y, used = around(p, h, coeffs_lib.recording(coeffs_lib.zeros_like(
        jax.eval_shape(lambda: hyper.weights(DIMS, p, h)))))
    y2, used2 = around(p, h, coeffs_lib.replaying(used))
    chex.assert_trees_all_equal((y, used), (y2, used2))
    flat = dict(used, comb=jnp.full_like(used["comb"], 0.25), post=jnp.ones_like(used["post"]),
                pre=jnp.full_like(used["pre"], 0.5))
    y3, used3 = around(p, h, coeffs_lib.replaying(flat))
    chex.assert_trees_all_equal(used3, flat)
    expected = block(0.5 * h.sum(-2))[..., None, :] + jnp.broadcast_to(
        h.mean(-2, keepdims=True), h.shape)
    np.testing.assert_allclose(y3, expected, rtol=0, atol=1e-6)
    assert around._cache_size() == 1


def test_schema_axes():
    for axes in (hyper.PRE_AXES, hyper.COMB_AXES, hyper.HEAD_AXES):
        assert "token" in axes and "example" in axes and "hc" in axes
    assert hyper.COMB_AXES.index("hc_in") == 3
