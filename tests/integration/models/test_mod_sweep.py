"""MoD beyond the unit tier (tests/unit/models/test_mod.py holds the model and the checks):
both causal routes' KV-cache decoding, the slot budget, eval.json's rules, and generate
against re-decoding the whole prefix each step."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax import decoding
from dynjax.measure import routing
from dynjax.models import build, mod
from tests.unit.models.test_mod import (  # noqa: F401 (model: a fixture)
    B, CFG, ROUTES, T, model,
    check_causal_routing_is_causal_at_every_split_and_kv_cache_matches_it)


@pytest.mark.parametrize("route", ROUTES)
def test_causal_routing_is_causal_at_every_split_and_kv_cache_matches_it_sweep(model, route):
    check_causal_routing_is_causal_at_every_split_and_kv_cache_matches_it(model, route)


def test_generate_is_greedy_decoding_over_cached_forward(model):
    _, params, tokens = model
    cfg = mod.decode_config(CFG, "predictor")
    prompt, steps = tokens[:, :3], 4
    out = jax.jit(lambda p: decoding.generate(cfg, params, p, steps))(prompt)
    assert out.shape == (B, 3 + steps) and np.array_equal(out[:, :3], prompt)
    seq = prompt
    for _ in range(steps):  # re-decode the whole prefix each time: the slow, obvious way
        logits, _ = decoding.cached_forward(cfg, params, seq)
        seq = jnp.concatenate([seq, jnp.argmax(logits[:, -1], -1)[:, None].astype(seq.dtype)], 1)
    np.testing.assert_array_equal(out, seq)


def test_slot_budget_admits_the_first_askers_and_the_rest_skip(model):
    """mod_decode_slots=N: the first N tokens that ask enter, later askers skip the block
    (the documented fallback); decoding and the sequence form agree, whatever the length."""
    _, params, tokens = model
    N = 3
    cfg = mod.decode_config(CFG, "router").replace(mod_decode_slots=N)
    stats = routing.routing_stats(build(cfg), params, tokens)
    free = routing.routing_stats(build(mod.decode_config(CFG, "router")), params, tokens)
    asked = np.asarray(free["entered"])[0]             # unlimited: every asker enters
    entered, overflow = np.asarray(stats["entered"])[0], np.asarray(stats["overflow"])[0]
    for b in range(B):
        askers = np.flatnonzero(asked[b])
        assert len(askers) > N                         # the budget binds in this example
        np.testing.assert_array_equal(np.flatnonzero(entered[b]), askers[:N])
        np.testing.assert_array_equal(np.flatnonzero(overflow[b]), askers[N:])
    logits = jax.jit(lambda t: build(cfg).apply(params, t)[0])(tokens)
    for max_len in (T, 3 * T):
        cached, info = jax.jit(
            lambda t: decoding.cached_forward(cfg, params, t, max_len=max_len))(tokens)
        ent = info["entered"]
        np.testing.assert_allclose(cached, logits, atol=1e-4, rtol=1e-4)
        np.testing.assert_array_equal(ent, stats["entered"])
    sparse = decoding.cache_bytes(decoding.init_cache(cfg, B, 64))
    dense = decoding.cache_bytes(decoding.init_cache(cfg.replace(variant="dense"), B, 64))
    assert sparse == dense * (64 + N) / (2 * 64)       # one dense and one MoD block of two
    with pytest.raises(ValueError, match="mod_decode_slots=-1"):
        build(CFG.replace(mod_decode_slots=-1))


def test_evaluation_reports_every_rule_with_a_causal_headline(model):
    """eval.json's figures: top-k labelled non-causal, the headline a causal rule, and the
    KV-cache decoder agreeing with the causal forward on the same windows."""
    from dynjax.train.evaluation import Evaluator
    _, params, tokens = model
    ev = Evaluator(CFG)
    out = ev(params, np.asarray(tokens), batch_size=2)
    assert out["route"] == "predictor" and out["causal"] is True
    assert {r: v["causal"] for r, v in out["routes"].items()} == {
        "topk": False, "router": True, "predictor": True}
    assert out["bpb"] == out["routes"]["predictor"]["bpb"]
    assert "topk" in ev.describe(out) and "(non-causal)" in ev.describe(out)
    assert Evaluator(CFG.replace(mod_predictor_weight=0.0)).headline == "router"
    with pytest.raises(ValueError, match="eval.route='sideways'"):
        Evaluator(CFG, "sideways")
    agree = ev.decode_agreement(params, np.asarray(tokens), batch_size=2)
    for rule in ("router", "predictor"):
        assert agree[rule]["max_abs_logit_diff"] < 1e-4
        assert agree[rule]["forward_bpb"] == pytest.approx(out["routes"][rule]["bpb"], abs=1e-5)
