"""One train step of the routing study's deepseek_sigmoid and hash arms (the arms' other
promises: tests/unit/models/test_routing_arms.py): the aux-loss-free bias update lowers the
overloaded expert's bias, and the hash table decides the experts and training keeps it."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax.models import llm
from dynjax.train import lm
from dynjax.train.optim import make_optimizer
from tests.unit.models.test_routing_arms import B, T, TOKENS, tiny, train_config


@pytest.fixture(scope="module")
def skewed_step():
    """One train step of the tiny deepseek_sigmoid and hash arms; the deepseek routers'
    selection biases start at (10, 0, ..., 0), so every token picks expert 0 (the skew)."""
    out = {}
    for arm in ("deepseek_sigmoid", "hash"):
        model = tiny(arm)
        params = model.init(jax.random.key(1))
        for p in params["layers"]:
            if "router_bias" in p["moe"]:
                p["moe"]["router_bias"] = p["moe"]["router_bias"].at[0].set(10.0)
        tc = train_config(arm, 4).train
        tc.warmup_steps = 0                # the first step's learning rate is the peak
        tx = make_optimizer(tc)
        state = {"step": jnp.zeros((), jnp.int32), "params": params,
                 "opt_state": tx.init(params)}
        before = jax.tree.map(jnp.copy, params)
        new, metrics = jax.jit(lm.make_train_step(model, tx))(state, TOKENS)
        out[arm] = model, before, new["params"], metrics
    return out


def test_a_train_step_lowers_the_overloaded_experts_bias(skewed_step):
    model, before, after, metrics = skewed_step["deepseek_sigmoid"]
    cfg = model.cfg
    _, coeffs = jax.jit(model.apply)(before, TOKENS)
    chosen = np.asarray(llm.selected_experts(cfg, before, coeffs["router"]))
    u = cfg.router_bias_rate
    for j, p in enumerate(after["layers"]):
        load = np.bincount(chosen[j].ravel(), minlength=cfg.num_experts)
        assert load[0] == B * T                     # the skew: every token picks expert 0
        np.testing.assert_allclose(metrics["moe_load_per_expert"][j], load / load.sum())
        old = np.asarray(before["layers"][j]["moe"]["router_bias"])
        want = old + np.float32(u) * np.sign(load.mean() - load).astype(np.float32)
        np.testing.assert_array_equal(p["moe"]["router_bias"], want)
        assert p["moe"]["router_bias"][0] < 10                  # the overloaded expert's falls
        assert np.all(np.asarray(p["moe"]["router_bias"])[load < load.mean()] > 0)
        # the gradient trains the router weight, never the bias
        assert not np.array_equal(p["moe"]["router"], before["layers"][j]["moe"]["router"])


def test_the_hash_table_decides_the_experts_and_training_keeps_it(skewed_step):
    model, before, after, metrics = skewed_step["hash"]
    cfg = model.cfg
    run = jax.jit(model.apply)
    logits, coeffs = run(before, TOKENS)
    for p, q in zip(before["layers"], after["layers"]):
        np.testing.assert_array_equal(q["moe"]["tid2eid"], p["moe"]["tid2eid"])  # kept
        assert not np.array_equal(q["moe"]["router"], p["moe"]["router"])         # trained
    want = np.stack([np.asarray(p["moe"]["tid2eid"]).astype(int)[np.asarray(TOKENS)]
                     for p in before["layers"]])
    np.testing.assert_array_equal(llm.selected_experts(cfg, before, coeffs["router"], TOKENS),
                                  want)
    np.testing.assert_allclose(metrics["moe_load_per_expert"], np.stack(   # the logged load
        [np.bincount(w.ravel(), minlength=cfg.num_experts) / w.size for w in want]))
    by_score = np.asarray(jax.lax.top_k(coeffs["router"], cfg.top_k)[1])
    assert not np.array_equal(np.sort(by_score, -1), np.sort(want, -1))   # not the scores
    # the forward routes by the table: another table, other logits; replay is exact
    swapped = jax.tree.map(lambda a: a, before)
    swapped["layers"][0]["moe"]["tid2eid"] = (before["layers"][0]["moe"]["tid2eid"] + 1) % 8
    assert not np.allclose(run(swapped, TOKENS)[0], logits)
    chex.assert_trees_all_equal(run(before, TOKENS, coeffs)[0], logits)
