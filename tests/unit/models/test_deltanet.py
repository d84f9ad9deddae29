"""Gated DeltaNet (dynjax.models.components.deltanet): the chunked delta rule equals the per-token
recurrence, decoding token by token equals the forward, both checkpoint layouts equal
transformers' layers (a committed reference, and live when torch is installed), and beta
and the decay are coefficient sites that replay bitwise in one compiled program."""
from __future__ import annotations

import functools
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax import coeffs as coeffs_lib
from dynjax.models.components import deltanet
from tests.conftest import normal, uniform

REFERENCE = pathlib.Path(__file__).parents[3] / "tests" / "data" / "deltanet_layer.npz"
DIMS = deltanet.Dims(hidden_size=32, key_heads=2, value_heads=4, key_dim=8, value_dim=6,
                     conv_kernel=4, rms_norm_eps=1e-6, chunk_size=8)
LAYOUTS = {"next": deltanet.from_qwen3_next, "q35": deltanet.from_qwen3_5}


@functools.lru_cache(maxsize=None)
def reference():
    data = np.load(REFERENCE)
    params = {}
    for prefix, convert in LAYOUTS.items():
        tensors = {k[len(prefix) + 1:]: data[k] for k in data.files if k.startswith(prefix + ".")}
        params[prefix] = jax.tree.map(jnp.asarray, convert(DIMS, tensors))
    return data, params


@functools.partial(jax.jit, static_argnames=("dims",))
def mix(dims, p, x, given=None, state=None):
    return deltanet.mix(dims, p, x, given, state)


def rule_inputs(T, seed=0, B=2, H=3, dk=5, dv=4):
    """Normalised q, k, v, log decays spanning near 1 to near 0, beta in (0, 1), a state."""
    q, k = (deltanet.l2_normalize(normal(10 * seed + i, (B, T, H, dk))) for i in (0, 1))
    v = normal(10 * seed + 2, (B, T, H, dv))
    g = -jnp.exp(uniform(10 * seed + 3, (B, T, H), -4.0, 1.0))
    beta = uniform(10 * seed + 4, (B, T, H))
    state = normal(10 * seed + 5, (B, H, dk, dv))
    return q, k, v, g, beta, state


recurrent = jax.jit(deltanet.delta_rule_recurrent)
chunked = jax.jit(deltanet.delta_rule_chunked, static_argnames="chunk_size")


@pytest.mark.parametrize("chunk_size", [4, 5, 32])
def test_chunked_equals_recurrence(chunk_size):
    """20 tokens in chunks of 4 (dividing), 5 (dividing, uneven count), 32 (one padded
    chunk) -- and 7 below, which leaves a partial last chunk -- from a non-zero state."""
    args = rule_inputs(20)
    o_ref, s_ref = recurrent(*args)
    o, s = chunked(*args, chunk_size=chunk_size)
    np.testing.assert_allclose(o, o_ref, atol=1e-5, rtol=0)
    np.testing.assert_allclose(s, s_ref, atol=1e-5, rtol=0)


def test_chunked_equals_recurrence_partial_last_chunk():
    args = rule_inputs(23, seed=1)
    o_ref, s_ref = recurrent(*args)
    o, s = chunked(*args, chunk_size=7)
    np.testing.assert_allclose(o, o_ref, atol=1e-5, rtol=0)
    np.testing.assert_allclose(s, s_ref, atol=1e-5, rtol=0)
    assert float(jnp.max(jnp.abs(o_ref[:, 7:] - o_ref[:, :-7]))) > 0.1   # not trivial


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layer_equals_transformers(layout):
    """Max |dy| against transformers' float32 layer (the committed reference)."""
    data, params = reference()
    y, _, _ = mix(DIMS, params[layout], jnp.asarray(data["x"]))
    err = float(np.max(np.abs(np.asarray(y) - data[f"{layout}.y"])))
    assert err <= 1e-5, f"{layout}: max |dy| = {err:.2e}"


def test_decoding_equals_forward():
    """A prefix through the chunked forward, then token by token from its state (conv and
    recurrent), equals the forward over the whole window at every position."""
    data, params = reference()
    x = jnp.asarray(data["x"])
    p = params["next"]
    full, _, final = mix(DIMS, p, x)
    head, _, state = mix(DIMS, p, x[:, :10])
    outs = [head]
    for t in range(10, x.shape[1]):
        y, _, state = mix(DIMS, p, x[:, t:t + 1], None, state)
        outs.append(y)
    np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, atol=2e-5, rtol=0)
    chex.assert_trees_all_close(state, final, atol=2e-5, rtol=0)


def test_prefill_in_two_chunked_pieces():
    """Two chunked calls (11 + 10 tokens, neither a multiple of the chunk) equal one."""
    data, params = reference()
    x = jnp.asarray(data["x"])
    p = params["q35"]
    full, _, final = mix(DIMS, p, x)
    first, _, state = mix(DIMS, p, x[:, :11])
    second, _, state = mix(DIMS, p, x[:, 11:], None, state)
    np.testing.assert_allclose(jnp.concatenate([first, second], 1), full, atol=2e-5, rtol=0)
    chex.assert_trees_all_close(state, final, atol=2e-5, rtol=0)


def test_conv_state_is_the_last_inputs():
    x = jnp.arange(2 * 6 * 3, dtype=jnp.float32).reshape(2, 6, 3)
    w = jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)), jnp.float32)
    prev = jnp.full((2, 3, 3), -1.0)
    y, state = deltanet.causal_conv(x, w, prev)
    chex.assert_trees_all_equal(state, x[:, 3:])
    padded = np.concatenate([np.asarray(prev), np.asarray(x)], axis=1)
    expect = sum(np.asarray(w)[j] * padded[:, j:j + 6] for j in range(4))
    np.testing.assert_allclose(y, expect, rtol=1e-6)


@functools.partial(jax.jit, static_argnames=("dims",))
def mix_given(dims, p, x, given):
    y, used, _ = deltanet.mix(dims, p, x, given)
    return y, used


def test_coefficients_record_and_replay_bitwise_in_one_program():
    """beta and the decay come out of their site with (example, token, head) axes; replaying
    them unchanged is bitwise the record, one executable serves both, and replaying changed
    values changes the output."""
    data, params = reference()
    x, p = jnp.asarray(data["x"]), params["next"]
    shapes = jax.eval_shape(lambda: deltanet.decay_and_beta(p, x))
    mix_given._clear_cache()
    y, used = mix_given(DIMS, p, x, coeffs_lib.recording(coeffs_lib.zeros_like(shapes)))
    assert used["deltanet_beta"].shape == (2, 21, 4) and used["deltanet_decay"].shape == (2, 21, 4)
    assert float(jnp.max(used["deltanet_decay"])) < 0.0
    chex.assert_trees_all_equal(used, deltanet.decay_and_beta(p, x))
    y2, used2 = mix_given(DIMS, p, x, coeffs_lib.replaying(used))
    chex.assert_trees_all_equal((y2, used2), (y, used))
    assert mix_given._cache_size() == 1
    for name in ("deltanet_beta", "deltanet_decay"):
        changed = dict(used, **{name: used[name][::-1]})
        y3, _ = mix_given(DIMS, p, x, coeffs_lib.replaying(changed))
        assert float(jnp.max(jnp.abs(y3 - y))) > 1e-2, name


def test_transformers_live():
    """The same layers built by transformers now, on a longer input than the reference's
    (70 tokens: several of our chunks, and two of transformers' 64-token chunks)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "make_deltanet_reference",
        pathlib.Path(__file__).parents[3] / "scripts" / "make_deltanet_reference.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    x = torch.randn(2, 70, DIMS.hidden_size, generator=torch.Generator().manual_seed(3))
    for prefix, layer in script.layers():
        tensors = {k: v.numpy() for k, v in layer.state_dict().items()}
        p = jax.tree.map(jnp.asarray, LAYOUTS[prefix](DIMS, tensors))
        with torch.no_grad():
            expect = layer(x).numpy()
        y, _, _ = mix(DIMS, p, jnp.asarray(x.numpy()))
        np.testing.assert_allclose(y, expect, atol=2e-5, rtol=0, err_msg=prefix)
