"""Dropless MoE dispatch beyond the unit tier (tests/unit/models/test_dispatch.py holds the
layer checks): every size and expert count, whole models against the one-hot form that never
drops, integrated MoDE, the ragged-dot path under vmap and grad, the compiled train step's
largest array, the audit's vmapped reassignments, and staged MoDE routed causally."""
import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax.audit import interventions
from dynjax.models import dispatch, mod, moe
from dynjax.models.transformer import ModelConfig
from tests.conftest import normal
from tests.unit.models.test_dispatch import (
    B, CFG, D, MODELS, SIZES, T, TOKENS, UNIT_SIZES,
    check_dropless_equals_every_expert_on_every_token,
    check_dropless_replay_is_bitwise_under_jit, check_model_equals_one_hot_that_never_drops,
    loss_fn, matmul_fn, pair, routing)


@pytest.mark.parametrize("impl", dispatch.IMPLS)
@pytest.mark.parametrize("E,k,block", [s for s in SIZES if s not in UNIT_SIZES])
def test_dropless_equals_every_expert_on_every_token_sweep(impl, E, k, block):
    check_dropless_equals_every_expert_on_every_token(impl, E, k, block)


@pytest.mark.parametrize("variant,E,k", MODELS)
def test_model_equals_one_hot_that_never_drops(variant, E, k):
    check_model_equals_one_hot_that_never_drops(variant, E, k)


def test_dropless_replay_is_bitwise_under_jit_integrated_mode():
    check_dropless_replay_is_bitwise_under_jit("mode_integrated")


def test_vmap_over_coefficient_reassignments_equals_one_hot():
    """The audit's R reassignments as one vmapped program: cross-input derangements of the
    recorded router probabilities, replayed through both dispatches."""
    cfg = CFG.replace(variant="mode_integrated", moe_num_experts=6, moe_num_experts_per_tok=2)
    onehot, dropless, params = pair(cfg)
    _, coeffs = jax.jit(dropless.apply)(params, TOKENS)
    keys = jax.random.split(jax.random.key(3), 3)
    stack = jax.vmap(lambda kk: interventions.cross_input(coeffs, dropless.schema, kk))(keys)
    assert not np.allclose(stack["router"][0], coeffs["router"])
    replay = lambda m: jax.jit(jax.vmap(lambda c: m.apply(params, TOKENS, c)[0]))
    got, want = replay(dropless)(stack), replay(onehot)(stack)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    one = jax.jit(lambda c: dropless.apply(params, TOKENS, c)[0])
    np.testing.assert_allclose(got[1], one(jax.tree.map(lambda a: a[1], stack)),
                               rtol=1e-5, atol=1e-5)


def test_staged_mode_causal_routing_equals_one_hot():
    """Staged MoDE routed causally by its router: slots of tokens that did not enter go to
    no expert; with buffers that cannot fill the one-hot form is the same function."""
    cfg = mod.decode_config(ModelConfig(
        family="mod", variant="mode_staged", d_model=D, n_heads=2, n_layers=2, d_ff=64,
        scan_layers=False).replace(mod_capacity=0.25, moe_num_experts=4,
                                   moe_num_experts_per_tok=2, moe_capacity_factor=0.0))
    onehot, dropless, params = pair(cfg)
    probe = normal(2, (B, T, cfg.vocab_size))
    (go, (lo, _)), (gd, (ld, _)) = (jax.jit(jax.grad(loss_fn(m, probe), has_aux=True))(
        params) for m in (onehot, dropless))
    np.testing.assert_allclose(ld, lo, rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_close(gd, go, rtol=1e-4, atol=1e-5)
    stats = lambda m: jax.jit(lambda p: m.module.apply({"params": p}, TOKENS, mutable=[
        "mod_stats"])[1]["mod_stats"]["stats"][0])(params)
    so, sd = stats(onehot), stats(dropless)
    assert float(np.asarray(so["entered"]).mean()) < 1     # some slots are empty
    chex.assert_trees_all_close({k: v for k, v in sd.items() if k.startswith("moe_")},
                                {k: v for k, v in so.items() if k.startswith("moe_")},
                                rtol=1e-5, atol=1e-6)
    f = jax.jit(lambda c=None: dropless.apply(params, TOKENS, c))
    logits, coeffs = f()
    chex.assert_trees_all_equal(f(coeffs), (logits, coeffs))


def test_ragged_dot_path_equals_blocks_path_under_vmap_and_grad():
    """The accelerator path (``ragged_dot``, its own vjp and batching rule) called
    explicitly on CPU: values, gradients, and vmap over routings with unbatched weights."""
    n, d, f, E, k, R = 32, 8, 16, 6, 2, 3
    x, w = normal(4, (n, d)), normal(5, (E, d, f))
    experts, weights = jax.vmap(lambda kk: routing(kk, n, k, E))(
        jax.random.split(jax.random.key(6), R))
    fwd = {impl: jax.jit(jax.vmap(matmul_fn(w, impl), (None, 0, 0))) for impl in dispatch.IMPLS}
    np.testing.assert_allclose(fwd["ragged"](x, experts, weights),
                               fwd["blocks"](x, experts, weights), rtol=1e-5, atol=1e-5)
    grads = {impl: jax.jit(jax.vmap(jax.grad(
        lambda w, e, g, i=impl: jnp.sum(matmul_fn(w, i)(x, e, g) ** 2)), (None, 0, 0)))(
        w, experts, weights) for impl in dispatch.IMPLS}
    np.testing.assert_allclose(grads["ragged"], grads["blocks"], rtol=1e-4, atol=1e-4)


def largest_array(compiled) -> int:
    """Elements of the largest array any instruction of a compiled program produces."""
    import re
    sizes = [int(np.prod([int(v) for v in dims.split(",") if v]))
             for dims in re.findall(r"\b(?:f32|bf16|s32|pred|f16)\[([\d,]*)\]",
                                    compiled.as_text())]
    return max(sizes)


def test_no_tokens_by_experts_by_capacity_tensor_in_the_compiled_train_step():
    """One MoE FFN where tokens x experts x capacity dwarfs every legitimate array: the
    one-hot program holds such a tensor, the dropless one nothing near it, and its
    temporaries are a small fraction of the one-hot ones."""
    n_tok, E, k, d = 256, 16, 2, 8
    cfg = CFG.replace(d_model=d, d_ff=d, moe_num_experts=E, moe_num_experts_per_tok=k)
    x = normal(4, (1, n_tok, d))
    params = nn.meta.unbox(moe.MoeFfn(cfg).init(jax.random.key(5), x))
    programs = {}
    for name in ("onehot", "dropless"):
        ffn = moe.MoeFfn(cfg.replace(moe_dispatch=name))
        step = jax.grad(lambda p: jnp.sum(ffn.apply(p, x)[0] ** 2))
        programs[name] = jax.jit(step).lower(params).compile()
    assert largest_array(programs["onehot"]) >= n_tok * E * n_tok
    sorted_rows = dispatch.n_rows(n_tok * k, E, dispatch.default_block(n_tok * k, E)) * d
    assert largest_array(programs["dropless"]) <= sorted_rows < n_tok * E * n_tok // 64
    temp = {n: c.memory_analysis().temp_size_in_bytes for n, c in programs.items()}
    assert temp["dropless"] * 20 < temp["onehot"], temp
