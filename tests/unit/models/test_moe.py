"""MoE and integrated MoDE: capacity and dropping as documented, losses, bitwise replay."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax.coeffs import replaying
from dynjax.models import build, moe
from dynjax.models.transformer import ModelConfig
from tests.conftest import normal

B, T, D, E = 2, 16, 32, 4
CFG = ModelConfig(family="moe", variant="moe", d_model=D, n_heads=2, n_layers=2, d_ff=64,
                  scan_layers=False).replace(moe_num_experts=E)


def ffn(cfg):
    x = normal(0, (B, T, D))
    module = moe.MoeFfn(cfg)
    params = nn.meta.unbox(module.init(jax.random.key(1), x))
    return jax.jit(lambda probs: module.apply(params, x, replaying(probs))), x


def one_hot_probs(experts, n=E):
    """Router probabilities that send token t to ``experts[t]`` first (0.7), others 0.3/(n-1)."""
    p = np.full((B, T, n), 0.3 / (n - 1), np.float32)
    p[:, np.arange(T), experts] = 0.7
    return jnp.asarray(p)


def test_token_choice_capacity_drops_later_tokens_whose_update_is_zero():
    cfg = CFG.replace(moe_capacity_factor=1.0)   # C = ceil(16 / 4) = 4
    run, _ = ffn(cfg)
    y, _, _, stats = run(one_hot_probs(np.zeros(T, int)))     # every token wants expert 0
    y = np.asarray(y)
    assert moe.expert_capacity(cfg, T) == 4
    assert np.all(np.abs(y[:, :4]).max(-1) > 0)               # the first 4 fit
    np.testing.assert_array_equal(y[:, 4:], 0)                # the rest are dropped
    assert float(stats["dropped"]) == 12 / 16
    # capacity_factor <= 0: an expert can take every token, nothing drops.
    run, _ = ffn(CFG.replace(moe_capacity_factor=0.0))
    y, _, _, stats = run(one_hot_probs(np.zeros(T, int)))
    assert float(stats["dropped"]) == 0 and np.all(np.abs(np.asarray(y)).max(-1) > 0)


def test_first_choices_fill_buffers_before_second_choices():
    dispatch, combine, kept = moe.token_choice(
        jnp.asarray([[[0.6, 0.4], [0.3, 0.7], [0.55, 0.45]]]), k=2, capacity=2)
    # Expert 0: first choices of tokens 0 and 2 fill it; token 1's second choice drops.
    np.testing.assert_array_equal(dispatch[0, :, 0].sum(-1), [1, 0, 1])
    # Expert 1: token 1's first choice, then token 0's second; token 2's second drops.
    np.testing.assert_array_equal(dispatch[0, :, 1].sum(-1), [1, 1, 0])
    np.testing.assert_allclose(combine[0, 0].sum(-1), [0.6, 0.4])
    np.testing.assert_array_equal(kept[0], [[1, 1], [1, 0], [1, 0]])


def test_position_priority_queues_in_token_order_and_skips_invalid_tokens():
    probs = jnp.asarray([[[0.6, 0.4], [0.3, 0.7], [0.55, 0.45]]])
    dispatch, _, kept = moe.token_choice(probs, k=2, capacity=2, by_position=True)
    # Token order: tokens 0 and 1 take both experts' two slots; token 2 finds both full.
    np.testing.assert_array_equal(kept[0], [[1, 1], [1, 1], [0, 0]])
    # A token that may not take slots (did not enter the MoD block) leaves them free.
    dispatch, _, kept = moe.token_choice(probs, k=2, capacity=2, by_position=True,
                                         valid=jnp.asarray([[True, False, True]]))
    np.testing.assert_array_equal(kept[0], [[1, 1], [0, 0], [1, 1]])
    assert float(dispatch[0, 1].sum()) == 0


def test_switch_load_balance_and_z_loss_equal_hand_computed_values():
    """Switch: E * sum_e f_e P_e with f_e the fraction of top-k assignments to e, P_e the
    mean router probability; ST-MoE z-loss: mean logsumexp(logits)^2."""
    cfg = CFG.replace(moe_num_experts=2, moe_load_balance_loss_weight=1.0,
                              moe_router_z_loss_weight=1.0, moe_capacity_factor=0.0)
    x = jnp.asarray([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])        # (1, 3, d=2)
    module = moe.MoeFfn(cfg.replace(d_model=2, d_ff=4))
    params = nn.meta.unbox(module.init(jax.random.key(0), x))
    w = np.array([[2.0, 0.0], [0.0, 1.0]], np.float32)               # logits = x @ w
    params["params"]["router"]["kernel"] = jnp.asarray(w)
    _, _, aux, _ = jax.jit(module.apply)(params, x)
    logits = np.array([[2.0, 0.0], [0.0, 1.0], [2.0, 1.0]])
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    f = np.array([2, 1]) / 3                                          # argmax: 0, 1, 0
    np.testing.assert_allclose(aux["load_balance"], 2 * np.sum(f * p.mean(0)), rtol=1e-6)
    lse = np.log(np.exp(logits).sum(-1))
    np.testing.assert_allclose(aux["router_z"], np.mean(lse ** 2), rtol=1e-6)


def test_expert_choice_balances_load_exactly():
    cfg = CFG.replace(moe_routing="expert_choice", moe_capacity_factor=1.0)
    run, _ = ffn(cfg)
    _, _, aux, stats = run(one_hot_probs(np.zeros(T, int)))
    np.testing.assert_allclose(stats["load"], np.full(E, 4 / 16))  # C = 4 tokens each
    assert "load_balance" not in aux


def test_integrated_mode_noop_expert_skips_the_mlp():
    cfg = CFG.replace(variant="mode_integrated", moe_capacity_factor=0.0)
    run, _ = ffn(cfg)
    experts = np.where(np.arange(T) % 2 == 0, E, 1)   # even tokens -> the no-op expert
    y, _, _, stats = run(one_hot_probs(experts, E + 1))
    y = np.asarray(y)
    np.testing.assert_array_equal(y[:, ::2], 0)
    assert np.all(np.abs(y[:, 1::2]).max(-1) > 0) and float(stats["noop"]) == 0.5


def test_losses_at_init():
    m = build(CFG)
    tokens = jax.random.randint(jax.random.key(2), (B, T), 0, 256)
    _, _, aux = jax.jit(lambda p: m.apply(p, tokens, with_aux=True))(
        m.init(jax.random.key(3), tokens))
    # Switch load balance is >= 1 (times the weight), equal to 1 only at perfect balance.
    assert aux["load_balance"] >= 0.01 * 0.999 and aux["router_z"] > 0


REPLAY = [("moe", "token_choice"), ("moe", "expert_choice"), ("mode_integrated", "token_choice")]
UNIT_REPLAY = REPLAY[:2]    # integrated MoDE: tests/integration/models/test_moe_sweep.py


def check_bitwise_replay_under_jit(variant, routing):
    cfg = CFG.replace(variant=variant, moe_routing=routing, moe_num_experts_per_tok=2)
    m = build(cfg)
    tokens = jax.random.randint(jax.random.key(4), (B, T), 0, 256)
    params = m.init(jax.random.key(5), tokens)
    f = jax.jit(lambda t, c=None: m.apply(params, t, c))
    logits, coeffs = f(tokens)
    assert coeffs["router"].shape == (cfg.n_layers, B, T, moe.n_routes(cfg))
    np.testing.assert_array_equal(f(tokens, coeffs)[0], logits)


@pytest.mark.parametrize("variant,routing", UNIT_REPLAY)
def test_bitwise_replay_under_jit(variant, routing):
    check_bitwise_replay_under_jit(variant, routing)


def test_config_errors():
    with pytest.raises(ValueError, match="moe_num_experts_per_tok"):
        build(CFG.replace(moe_num_experts_per_tok=5))
    with pytest.raises(ValueError, match="moe_routing"):
        build(CFG.replace(moe_routing="hash"))
