"""Narrow products (dynjax.models.matmul): bfloat16 operands reach the dot as bfloat16 with a
float32 result, rounded once; float32 stays the plain product."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax.models import matmul

CASES = [("btd,dhk->bthk", (2, 33, 64), (64, 4, 16)),
         ("bhqk,bkhd->bqhd", (2, 4, 33, 33), (2, 33, 4, 16)),
         ("nd,df->nf", (96, 1024), (1024, 64))]


def _operands(sa, sb, dtype):
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.standard_normal(s), dtype) for s in (sa, sb))


@pytest.mark.parametrize("eq,sa,sb", CASES)
def test_float32_is_the_plain_einsum(eq, sa, sb):
    a, b = _operands(sa, sb, jnp.float32)
    chex.assert_trees_all_equal(jax.jit(lambda a, b: matmul.einsum(eq, a, b))(a, b),
                                jax.jit(lambda a, b: jnp.einsum(eq, a, b))(a, b))


@pytest.mark.parametrize("eq,sa,sb", CASES)
def test_bfloat16_rounds_the_float32_sum_once(eq, sa, sb):
    """bfloat16 out, each entry the float64 product rounded to bfloat16, give or take the
    last bit that the order of float32 sums decides."""
    a, b = _operands(sa, sb, jnp.bfloat16)
    out = jax.jit(lambda a, b: matmul.einsum(eq, a, b))(a, b)
    if eq == "nd,df->nf":   # the same product through mm
        chex.assert_trees_all_equal(jax.jit(matmul.mm)(a, b), out)
    assert out.dtype == jnp.bfloat16
    exact = np.einsum(eq, np.asarray(a, np.float64), np.asarray(b, np.float64))
    rounded = np.asarray(jnp.asarray(exact, jnp.float32).astype(jnp.bfloat16), np.float64)
    ulp = np.abs(rounded) * 2.0 ** -7 + 1e-30
    np.testing.assert_array_less(np.abs(np.asarray(out, np.float64) - rounded), ulp * 1.01)
    assert np.mean(np.asarray(out, np.float64) == rounded) > 0.99


def test_bfloat16_operands_reach_the_dot_unwidened():
    """The speed: the dot itself takes bfloat16 and returns float32 (XLA:CPU widens both
    operands of a bfloat16 -> bfloat16 dot to float32 first)."""
    a, b = _operands((8, 16), (16, 4), jnp.bfloat16)
    for fn in (lambda a, b: matmul.mm(a, b), lambda a, b: matmul.einsum("nd,df->nf", a, b)):
        text = jax.jit(fn).lower(a, b).as_text()
        dots = [line for line in text.splitlines() if "dot_general" in line]
        assert len(dots) == 1 and "bf16>, tensor<16x4xbf16>) -> tensor<8x4xf32>" in dots[0], dots
