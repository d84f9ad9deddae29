"""Products of narrow (bfloat16) operands, taken in float32 and rounded once.

XLA:CPU runs a bfloat16 x bfloat16 -> bfloat16 dot by widening both operands to float32
first (float32 speed, plus the conversions), while the same dot asked for a float32 result
runs natively (YNNPACK): 2-3x faster on AVX-512. Rounding that float32 result to bfloat16
once is the rounding a bfloat16 dot has; only the order of the float32 sums differs, so an
entry can differ from XLA's bfloat16 dot in its last bit, equally accurate. Float32
operands are untouched.
Depth: docs/performance.md#performance ("bfloat16 products")
"""
import jax.numpy as jnp


def narrow(dtype) -> bool:
    """Whether a float dtype is narrower than float32 (its products are summed in float32)."""
    return jnp.finfo(dtype).bits < 32


def einsum(eq: str, a, b):
    """``jnp.einsum(eq, a, b)`` in the operands' result dtype, the products summed in float32
    where that dtype is narrower."""
    dt = jnp.result_type(a, b)
    if not narrow(dt):
        return jnp.einsum(eq, a, b)
    return jnp.einsum(eq, a, b, preferred_element_type=jnp.float32).astype(dt)


def mm(a, b):
    """``a @ b`` (a (..., k), b (k, n)) as :func:`einsum` takes it."""
    dt = jnp.result_type(a, b)
    if not narrow(dt):
        return a @ b
    return jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(dt)
