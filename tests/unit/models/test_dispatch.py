"""Dropless MoE dispatch: the sort-by-expert layout, both grouped matmuls, and the models'
``moe_dispatch="dropless"`` against the one-hot form that never drops (capacity <= 0).
The unit tier checks one case of each sweep; the other sizes, expert counts and variants,
the vmapped reassignments and staged MoDE are tests/integration/models/test_dispatch_sweep.py."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax.models import build, dispatch, moe
from dynjax.models.transformer import ModelConfig
from tests.conftest import normal

B, T, D = 2, 16, 32
CFG = ModelConfig(family="moe", variant="moe", d_model=D, n_heads=2, n_layers=1, d_ff=64,
                  scan_layers=False).replace(moe_capacity_factor=0.0)
TOKENS = jax.random.randint(jax.random.key(0), (B, T), 0, 256)


def dense_reference(x, w, experts, weights):
    """Every token through every expert, then the routes picked by a one-hot mask."""
    E = w.shape[0]
    h = jnp.einsum("nd,edf->nef", x, w)
    live = (experts >= 0) & (experts < E)
    mask = jax.nn.one_hot(jnp.where(live, experts, E), E) * weights[..., None]
    return jnp.einsum("nke,nef->nf", mask, h)


def routing(key, n, k, E, nowhere=True):
    """Distinct experts per token (as top-k gives), some routed nowhere (-1 or E)."""
    ke, kn, kw = jax.random.split(key, 3)
    experts = jax.vmap(lambda kk: jax.random.permutation(kk, E)[:k])(jax.random.split(ke, n))
    if nowhere:
        drop = jax.random.bernoulli(kn, 0.2, (n, k))
        experts = jnp.where(drop, jnp.where(jnp.arange(n)[:, None] % 2 == 0, -1, E), experts)
    return experts.astype(jnp.int32), jax.random.uniform(kw, (n, k))


def matmul_fn(w, impl):
    return lambda x, experts, weights: dispatch.dropless(
        x, experts, weights, w.shape[0], lambda r, g: dispatch.grouped_matmul(r, w, g),
        impl=impl)


SIZES = [(4, 1, None), (5, 2, 8), (64, 4, None), (8, 3, 1),
         (1, 1, 8)]   # (E, k, block); the last: 3 blocks in all, fewer than CHUNK
UNIT_SIZES = [(5, 2, 8)]


def check_dropless_equals_every_expert_on_every_token(impl, E, k, block):
    """Values and the gradients of rows, experts and weights against the dense reference."""
    n, d, f = 24, 8, 16
    x, w = normal(1, (n, d)), normal(2, (E, d, f))
    experts, weights = routing(jax.random.key(3), n, k, E)
    run = jax.jit(lambda x, w, e, g: dispatch.dropless(
        x, e, g, E, lambda r, gr: dispatch.grouped_matmul(r, w, gr), block=block, impl=impl))
    np.testing.assert_allclose(run(x, w, experts, weights),
                               dense_reference(x, w, experts, weights), rtol=1e-5, atol=1e-5)
    loss = lambda fn: lambda *a: jnp.sum(jnp.sin(fn(*a)))
    got = jax.jit(jax.grad(loss(run), (0, 1, 3)))(x, w, experts, weights)
    want = jax.grad(loss(dense_reference), (0, 1, 3))(x, w, experts, weights)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impl", dispatch.IMPLS)
@pytest.mark.parametrize("E,k,block", UNIT_SIZES)
def test_dropless_equals_every_expert_on_every_token(impl, E, k, block):
    check_dropless_equals_every_expert_on_every_token(impl, E, k, block)


def test_layout_sorts_by_expert_pads_to_blocks_and_skips_unrouted_pairs():
    experts = jnp.asarray([2, 0, 2, -1, 0, 2, 3, 2], jnp.int32)      # expert 1: no pair
    dest, row_pair, groups = dispatch.layout(experts, 4, block=2, impl="blocks")
    assert groups.rows == dispatch.n_rows(8, 4, 2) == 12   # (8 + 4 * (2 - 1)) // 2 blocks
    np.testing.assert_array_equal(groups.group_sizes, [2, 0, 4, 2])
    np.testing.assert_array_equal(groups.block_expert, [0, 2, 2, 3, 3, 3])   # unused blocks: E-1
    # expert 0's rows 0-1 (pairs 1, 4), expert 2's rows 2-5 (pairs 0, 2, 5, 7, in order),
    # expert 3's row 6 (pair 6) and its padding; pair 3 (expert -1) has no row.
    np.testing.assert_array_equal(dest, [2, 0, 3, 12, 1, 4, 6, 5])
    np.testing.assert_array_equal(row_pair[:7], [1, 4, 0, 2, 5, 7, 6])
    np.testing.assert_array_equal(groups.row_expert, np.repeat([0, 2, 2, 3, 3, 3], 2))


def test_expert_bias_and_swiglu_experts():
    """What the Hugging Face ports build from the API: SwiGLU experts with biases."""
    n, d, f, E, k = 20, 8, 12, 4, 2
    x, wg, wu, wd, bias = (normal(70 + i, shape) for i, shape in enumerate(
        [(n, d), (E, d, f), (E, d, f), (E, f, d), (E, d)]))
    experts, weights = routing(jax.random.key(7), n, k, E, nowhere=False)

    def expert_fn(rows, g):
        gm = lambda w: dispatch.grouped_matmul(rows, w, g)
        h = jax.nn.silu(gm(wg)) * gm(wu)
        return dispatch.grouped_matmul(h, wd, g) + dispatch.expert_bias(bias, g)

    y = jax.jit(lambda x: dispatch.dropless(x, experts, weights, E, expert_fn))(x)
    x, wg, wu, wd, bias, experts, weights = map(np.asarray, (x, wg, wu, wd, bias, experts,
                                                             weights))
    silu = lambda a: a / (1 + np.exp(-a))
    per = lambda xe, e: (silu(xe @ wg[e]) * (xe @ wu[e])) @ wd[e] + bias[e]
    want = [sum(weights[i, j] * per(x[i], experts[i, j]) for j in range(k)) for i in range(n)]
    np.testing.assert_allclose(y, np.stack(want), rtol=1e-4, atol=1e-4)


def test_one_program_for_every_routing():
    n, E = 16, 4
    x, w = normal(8, (n, 8)), normal(9, (E, 8, 8))

    @jax.jit
    @chex.assert_max_traces(n=1)
    def run(experts, weights):
        return matmul_fn(w, "blocks")(x, experts, weights)

    for seed in range(3):   # all to one expert, then spread: same shapes, one trace
        experts, weights = routing(jax.random.key(seed), n, 2, E)
        run(jnp.zeros_like(experts) if seed == 0 else experts, weights)


# ----------------------------------------------------------------------------- models

def pair(cfg):
    """The same parameters under the one-hot (never dropping) and dropless dispatch."""
    onehot, dropless = build(cfg), build(cfg.replace(moe_dispatch="dropless"))
    return onehot, dropless, onehot.init(jax.random.key(1), TOKENS)


def loss_fn(model, probe):
    def loss(params, coeffs=None):
        logits, _, aux = model.apply(params, TOKENS, coeffs, with_aux=True)
        return jnp.sum(logits * probe) + sum(aux.values()), (logits, aux)
    return loss


MODELS = [("moe", 4, 1), ("mode_integrated", 16, 3), ("moe", 64, 4)]   # (variant, E, k)


def check_model_equals_one_hot_that_never_drops(variant, E, k):
    """Logits, both auxiliary losses, every parameter's gradient, the routing statistics."""
    cfg = CFG.replace(variant=variant, moe_num_experts=E, moe_num_experts_per_tok=k,
                      moe_load_balance_loss_weight=1.0, moe_router_z_loss_weight=1.0)
    onehot, dropless, params = pair(cfg)
    probe = normal(2, (B, T, cfg.vocab_size))
    out = {name: jax.jit(jax.value_and_grad(loss_fn(m, probe), has_aux=True))(params)
           for name, m in (("onehot", onehot), ("dropless", dropless))}
    (_, (lo, ao)), go = out["onehot"]
    (_, (ld, ad)), gd = out["dropless"]
    np.testing.assert_allclose(ld, lo, rtol=1e-5, atol=1e-5)
    assert set(ad) == set(ao) == {"load_balance", "router_z"}
    for name in ao:
        np.testing.assert_allclose(ad[name], ao[name], rtol=1e-5)
    chex.assert_trees_all_close(gd, go, rtol=1e-4, atol=1e-5)
    # the routing statistics the measurements read
    stats = lambda m: jax.jit(lambda p: m.module.apply({"params": p}, TOKENS, mutable=[
        "moe_stats"])[1]["moe_stats"]["stats"][0])(params)
    so, sd = stats(onehot), stats(dropless)
    chex.assert_trees_all_close(sd, so, rtol=1e-5, atol=1e-6)


def check_dropless_replay_is_bitwise_under_jit(variant):
    _, model, params = pair(CFG.replace(variant=variant, moe_num_experts_per_tok=2))
    f = jax.jit(lambda c=None: model.apply(params, TOKENS, c))
    logits, coeffs = f()
    chex.assert_trees_all_equal(f(coeffs), (logits, coeffs))


@pytest.mark.parametrize("variant", ["moe"])   # "mode_integrated": the integration tier
def test_dropless_replay_is_bitwise_under_jit(variant):
    check_dropless_replay_is_bitwise_under_jit(variant)


def test_config_errors():
    with pytest.raises(ValueError, match="moe_dispatch"):
        build(CFG.replace(moe_dispatch="sorted"))
    with pytest.raises(ValueError, match="token_choice"):
        build(CFG.replace(moe_dispatch="dropless", moe_routing="expert_choice",
                          moe_capacity_factor=1.0))
    with pytest.raises(ValueError, match="impl"):
        dispatch.layout(jnp.zeros(4, jnp.int32), 2, impl="megablox")
    assert moe.is_causal(CFG.replace(moe_dispatch="dropless", moe_num_experts_per_tok=2,
                                     moe_capacity_factor=1.0))


def test_analytic_flops_count_the_sorted_rows_not_buffers():
    from dynjax.measure import lm_execution as execution
    cfg = CFG.replace(moe_num_experts=8, moe_num_experts_per_tok=2)
    onehot = execution.analytic_forward_flops(cfg, 1, 64)
    drop = execution.analytic_forward_flops(cfg.replace(moe_dispatch="dropless"), 1, 64)
    rows = dispatch.n_rows(128, 8, dispatch.default_block(128, 8))     # 64 tokens x top-2
    assert drop["moe_experts"] == rows * 2 * 2 * D * 64 and "moe_dispatch_combine" not in drop
    assert onehot["moe_experts"] == 8 * 64 * 2 * 2 * D * 64             # E buffers of T slots


def test_bfloat16_grouped_matmul_rounds_float32_products_once():
    """bfloat16 rows and experts: each row is its expert's float32 product rounded once to
    bfloat16 (what XLA's own bfloat16 dot gives), within one rounding step."""
    E, d, f = 4, 512, 8
    experts = jax.random.randint(jax.random.key(4), (64,), 0, E)
    _, _, groups = dispatch.layout(experts, E, block=8, impl="blocks")
    rows = normal(5, (groups.rows, d)).astype(jnp.bfloat16)
    w = normal(6, (E, d, f)).astype(jnp.bfloat16)
    got = jax.jit(lambda r, w: dispatch.grouped_matmul(r, w, groups))(rows, w)
    want = jnp.einsum("ma,mab->mb", rows.astype(jnp.float32),
                      w.astype(jnp.float32)[groups.row_expert],
                      precision=jax.lax.Precision.HIGHEST).astype(jnp.bfloat16)
    used = int(groups.group_sizes.sum())
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got[:used], np.float32),
                               np.asarray(want[:used], np.float32), rtol=2 ** -7, atol=0)


def test_bfloat16_expert_stack_is_not_widened_in_the_compiled_loop():
    """The grouped matmul reads a bfloat16 expert stack as it is: no float32 copy of the
    whole (E, a, b) stack in the compiled program (XLA:CPU makes one, every call, when the
    loop's dot reads the stack through a dynamic slice of its bfloat16 values)."""
    E, d, f = 8, 64, 32
    experts = jax.random.randint(jax.random.key(4), (128,), 0, E)
    _, _, groups = dispatch.layout(experts, E, block=8, impl="blocks")
    rows = jnp.zeros((groups.rows, d), jnp.bfloat16)
    w = jnp.zeros((E, d, f), jnp.bfloat16)
    text = jax.jit(lambda r, w: dispatch.grouped_matmul(r, w, groups)).lower(
        rows, w).compile().as_text()
    assert f"bf16[{E},{d},{f}]" in text and f"f32[{E},{d},{f}]" not in text
