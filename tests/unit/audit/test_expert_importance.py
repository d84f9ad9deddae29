"""REAP saliency and causal expert importance (dynjax/audit/expert_importance.py).

Promised and tested, on one tiny llm MoE shared by the module: removing an expert no token
uses changes nothing, bitwise; removing a used one changes the NLL; a removed expert's
tokens go to their next choice (a top-1 renormalised router: the removal equals swapping
the expert's score with the token's second choice); REAP's saliency is the mean over the
routed tokens of gate x ||expert output||, against a NumPy computation of the layer; the
comparison's tables, correlations and pruning costs have their shapes and the unpruned
cost; a dense model and too many removals are one line.
"""
import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax.audit import expert_importance as ei
from dynjax.errors import ConfigError
from dynjax.models import llm

E = 4
CFG = llm.Config(model_type="olmoe", vocab_size=256, hidden_size=16, n_layers=2, n_heads=2,
                 n_kv_heads=2, head_dim=8, intermediate_size=32, qk_norm="full",
                 moe_layers=(0, 1), num_experts=E, top_k=1, moe_intermediate_size=16,
                 norm_topk_prob=True)
GAIN = 30.0


def _params(cfg, seed=3):
    params = llm.init(cfg, jax.random.key(seed))
    for layer in params["layers"]:
        layer["moe"]["router"] = layer["moe"]["router"] * GAIN
    # layer 0's expert E-1 is never a top-1 choice: its score is the mean of experts 0
    # and 1's, never above both
    r = params["layers"][0]["moe"]["router"]
    params["layers"][0]["moe"]["router"] = r.at[:, E - 1].set((r[:, 0] + r[:, 1]) / 2)
    return params


WINDOWS = np.asarray(jax.random.randint(jax.random.key(5), (6, 16), 0, 256), np.int32)


@pytest.fixture(scope="module")
def rec():
    return ei.Recorded(llm.LLM(CFG), _params(CFG), WINDOWS, batch=3)


def test_removing_an_expert_no_token_uses_changes_nothing_bitwise(rec):
    chosen = np.argmax(np.concatenate([np.asarray(c["router"]) for c in rec.coeffs], 1), -1)
    assert not np.any(chosen[0] == E - 1), "the fixture's unused expert is used"
    removed = np.zeros((2, E), bool)
    removed[0, E - 1] = True
    chex.assert_trees_all_equal(rec.nll(removed), rec.nll())


def test_removing_a_used_expert_changes_the_nll(rec):
    chosen = np.argmax(np.asarray(rec.coeffs[0]["router"]), -1)
    used = int(np.bincount(chosen[1].ravel(), minlength=E).argmax())
    removed = np.zeros((2, E), bool)
    removed[1, used] = True
    delta = rec.nll(removed) - rec.nll()
    assert np.all(np.isfinite(delta)) and np.abs(delta).max() > 1e-4


def test_a_removed_experts_tokens_go_to_their_next_choice(rec):
    """Top-1, renormalised: the second choice takes the token with weight 1, which is what
    replaying the scores with the expert's and the second choice's values swapped gives."""
    layer = 1
    scores = np.asarray(rec.coeffs[0]["router"])
    e = int(np.bincount(np.argmax(scores[layer], -1).ravel(), minlength=E).argmax())
    swapped = scores.copy()
    first = np.argmax(scores[layer], -1) == e
    second = np.argsort(scores[layer], -1)[..., -2]
    s = swapped[layer]
    b, t = np.nonzero(first)
    s[b, t, e], s[b, t, second[b, t]] = scores[layer][b, t, second[b, t]], scores[layer][b, t, e]
    model = llm.LLM(CFG)
    no_removal = jnp.zeros((2, E), bool)
    expected = ei._replay_nll(model, rec.params, jnp.asarray(WINDOWS[:3]),
                              dict(rec.coeffs[0], router=jnp.asarray(swapped)), no_removal)
    removed = np.zeros((2, E), bool)
    removed[layer, e] = True
    got = ei._replay_nll(model, rec.params, jnp.asarray(WINDOWS[:3]), rec.coeffs[0],
                         jnp.asarray(removed))
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=0, atol=1e-6)
    assert np.abs(np.asarray(got) - rec.nll()[:3]).max() > 1e-4


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


def test_reap_saliency_is_the_routed_mean_of_gate_times_output_norm():
    """A one-layer model whose attention adds nothing (o = 0), so the MoE input is
    RMS(embedding) and the saliency is computed here in NumPy from the weights."""
    cfg = dataclasses.replace(CFG, n_layers=1, moe_layers=(0,), top_k=2, norm_topk_prob=False)
    params = jax.device_get(_params(cfg, seed=11))
    params["layers"][0]["attn"]["o"] = np.zeros_like(params["layers"][0]["attn"]["o"])
    params = jax.tree.map(np.asarray, params)
    r = ei.Recorded(llm.LLM(cfg), params, WINDOWS, batch=6)
    got = ei.reap_saliency(r)
    p = params["layers"][0]
    x = _rms(params["embed"][WINDOWS].astype(np.float64), p["post_norm"], cfg.rms_norm_eps)
    x = x.reshape(-1, cfg.hidden_size)
    logits = x @ p["moe"]["router"]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    top = np.argsort(-probs, -1)[:, :2]
    w = p["moe"]["experts"]
    silu = lambda z: z / (1 + np.exp(-z))
    want, count = np.zeros(E), np.zeros(E)
    for n in range(x.shape[0]):
        for e in top[n]:
            f = (silu(x[n] @ w["gate"][e]) * (x[n] @ w["up"][e])) @ w["down"][e]
            want[e] += probs[n, e] * np.linalg.norm(f)
            count[e] += 1
    want = np.where(count > 0, want / np.maximum(count, 1), 0.0)
    np.testing.assert_array_equal(got["routed_tokens"][0], count)
    np.testing.assert_allclose(got["saliency"][0], want, rtol=2e-5)
    # the routed-token mean differs from the all-token mean wherever an expert is not on
    # every token (what REAP's definition says)
    assert np.all(count < x.shape[0]) and not np.allclose(want, want * count / x.shape[0])


def test_the_comparison_reports_rankings_correlations_and_pruning_costs(rec):
    causal = ei.causal_importance(rec, n_resamples=199)
    assert causal["delta"].shape == (2, E, len(WINDOWS))
    assert np.all(causal["ci_low"] <= causal["mean"]) and np.all(causal["mean"] <= causal["ci_high"])
    assert causal["mean"][0, E - 1] == 0.0
    reap = ei.reap_saliency(rec)
    rho = ei.spearman_per_layer(reap["saliency"], causal["mean"])
    assert len(rho) == 2 and all(-1 <= r["rho"] <= 1 for r in rho)
    cost = ei.pruning_cost(rec, {"reap": reap["saliency"]}, fractions=(0.25, 0.5))
    base = float(rec.nll().mean() / np.log(2))
    assert cost["base_bits_per_byte"] == pytest.approx(base)
    assert [len(r) for r in cost["reap"]["0.5"]["removed"]] == [2, 2]
    # layer 0's unused expert has saliency 0: the bottom 25% removes it and nothing else
    assert cost["reap"]["0.25"]["removed"][0] == [E - 1]


def test_a_dense_model_and_removing_too_many_experts_are_one_line(rec):
    dense = llm.Config(**{**{f.name: getattr(CFG, f.name) for f in dataclasses.fields(CFG)},
                          "moe_layers": ()})
    with pytest.raises(ConfigError, match="no 'router' coefficient"):
        ei.Recorded(llm.LLM(dense), llm.init(dense, jax.random.key(0)), WINDOWS)
    with pytest.raises(ConfigError, match="fewer than top_k"):
        rec.nll(np.ones((2, E), bool))


def test_per_layer_conditions_token_identity_of_singletons_is_exact_and_cross_input_moves():
    """Windows whose every token id is distinct: token_identity leaves each position its own
    scores (ΔNLL 0, bitwise); cross_input of one layer's scores changes the NLL."""
    from dynjax.audit import layer_conditions

    distinct = np.arange(96, dtype=np.int32).reshape(6, 16)
    r = ei.Recorded(llm.LLM(CFG), _params(CFG), distinct, batch=3)
    delta = layer_conditions.per_layer(r, reassignments=2)
    assert delta["token_identity"].shape == (2, 2, 6)
    np.testing.assert_array_equal(delta["token_identity"], 0.0)
    assert np.abs(delta["cross_input"][1]).max() > 1e-4
    rows = layer_conditions.summarize(delta, n_resamples=199)
    assert rows[1]["difference"]["estimate"] == pytest.approx(
        -delta["cross_input"][1].mean(), abs=1e-12)
