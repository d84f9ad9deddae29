"""One MoE FFN (``models.moe_ffn``) for the moe family, integrated MoDE and the llm family:
every dispatch form computes the same function for every expert kind, and each family's
``moe_dispatch`` takes the one value set. The moe family's logits under every dispatch:
tests/integration/models/test_moe_ffn_sweep.py."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax.models import build, llm, moe, moe_ffn
from dynjax.models.components.experts import EXPERTS
from dynjax.models.transformer import ModelConfig
from tests.conftest import normal

B, T, D, F, E, K = 2, 8, 8, 16, 4, 2


def _weights(kind_name, seed):
    kind = EXPERTS[kind_name](llm.Config(swiglu_limit=0.5))
    rows = kind.rows(("w",), D, F, E)
    return kind, {path[-1]: normal(seed + i, shape, 0.3)
                  for i, (path, shape, _) in enumerate(rows)}


@pytest.fixture(scope="module")
def routed():
    x = normal(0, (B, T, D))
    probs = jax.nn.softmax(normal(1, (B, T, E + 1)), -1)
    weights, experts = jax.lax.top_k(probs, K)     # route E is a no-op expert
    return x, probs, experts, weights


@pytest.mark.parametrize("kind_name", sorted(EXPERTS))
def test_every_dispatch_computes_the_same_function(kind_name, routed):
    """onehot with room for every token, dropless and dense agree, the no-op route and
    invalid tokens computing nothing, and each route's output is its MLP's, weighted."""
    x, probs, experts, weights = routed
    kind, w = _weights(kind_name, 20)
    valid = jnp.arange(T)[None, :] < jnp.asarray([[T], [T - 3]])
    out = {d: jax.jit(lambda x, d=d: moe_ffn.moe_ffn(
        x, probs, experts, weights, w, kind=kind, num_experts=E, dispatch=d, capacity=T,
        valid=valid))(x) for d in moe_ffn.DISPATCHES}
    every = np.asarray(kind.dense(w, x.reshape(B * T, D))).reshape(B, T, E, D)
    want = np.zeros((B, T, D), np.float32)
    experts_np, weights_np, valid_np = map(np.asarray, (experts, weights, valid))
    for b, t, j in np.ndindex(B, T, K):      # numpy: no device dispatch per element
        e = int(experts_np[b, t, j])
        if e < E and valid_np[b, t]:
            want[b, t] += float(weights_np[b, t, j]) * every[b, t, e]
    for name, (y, stats) in out.items():
        np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-6, err_msg=name)
        np.testing.assert_array_equal(stats["ffn_ran"], np.asarray(
            ((experts < E).any(-1)) & valid), err_msg=name)
        assert abs(float(stats["dropped"])) < 1e-6, name


def test_load_balance_is_one_at_uniform_routing_and_weighted():
    uniform = jnp.full((1, 4, 4), 0.25)
    experts = jnp.arange(4).reshape(1, 4, 1)
    assert float(moe_ffn.load_balance(uniform, experts)) == pytest.approx(1.0)
    assert float(moe_ffn.load_balance(uniform, experts, 0.01)) == pytest.approx(0.01)
    logits = jnp.asarray([[0.0, np.log(3.0)]])
    assert float(moe_ffn.router_z(logits, 2.0)) == pytest.approx(2 * np.log(4.0) ** 2)


def test_one_value_set_for_moe_dispatch_in_both_families():
    assert moe.DISPATCHES == llm.MOE_DISPATCHES == moe_ffn.DISPATCHES
    for d in moe_ffn.DISPATCHES:
        build(ModelConfig(family="moe", variant="moe", d_model=16, n_heads=2, d_ff=32)
              .replace(moe_dispatch=d))
        build(dataclasses.asdict(llm.Config(moe_layers=(0,), num_experts=4, top_k=2,
                                            moe_intermediate_size=8, moe_dispatch=d))
              | {"family": "llm"})
    with pytest.raises(ValueError, match="moe_dispatch"):
        llm.Config(moe_dispatch="sorted")


def check_each_family_gives_the_same_logits_under_every_dispatch(family):
    """Integrated MoDE (GELU experts, top-2 onehot buffers with room for every token) and an
    llm MoE layer (SwiGLU, top-2 renormalised): onehot, dropless and dense logits agree."""
    tokens = jnp.asarray(np.arange(2 * 8).reshape(2, 8) * 5 % 32, jnp.int32)
    if family == "moe":
        base = ModelConfig(family="moe", variant="mode_integrated", vocab_size=32, d_model=16,
                           n_heads=2, n_layers=2, d_ff=32).replace(moe_capacity_factor=0.0,
                                                                     moe_num_experts_per_tok=2)
        cfgs = {d: base.replace(moe_dispatch=d) for d in moe_ffn.DISPATCHES}
    else:
        base = dict(family="llm", vocab_size=32, hidden_size=16, n_heads=2, n_kv_heads=1,
                    head_dim=8, intermediate_size=32, moe_layers=(0, 1), num_experts=4,
                    top_k=2, moe_intermediate_size=8, norm_topk_prob=True)
        cfgs = {d: dict(base, moe_dispatch=d) for d in moe_ffn.DISPATCHES}
    models = {d: build(c) for d, c in cfgs.items()}
    params = models["dropless"].init(jax.random.key(3), tokens)
    logits = {d: jax.jit(m.apply)(params, tokens)[0] for d, m in models.items()}
    for d in ("onehot", "dense"):
        np.testing.assert_allclose(logits[d], logits["dropless"], rtol=1e-5, atol=1e-5,
                                   err_msg=d)
