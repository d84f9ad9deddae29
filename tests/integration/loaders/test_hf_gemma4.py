"""Gemma-4's text model (``dynjax/loaders/archs/gemma4.py``) against transformers' float32
forward on tests/data/hf/gemma4 (made by scripts/make_hf_hybrid_fixtures.py: the
multimodal wrapper, a sliding-window layer then a full-attention one with its own head
width, one KV head and K = V, MoE beside a dense MLP in both): logits, router scores and
expert sets, the router scores as a replayed site, KV-cache decoding, the wrapper's towers
skipped, both spellings of the full layers' heads, the refusals."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax import coeffs as coeffs_lib
from dynjax.errors import ConfigError
from dynjax.loaders import hf
from dynjax.models import llm
from tests.integration.loaders.test_hf import DATA, assert_greedy_is_the_forwards_argmax, loaded

LOGIT_TOL = 2e-5   # float32 max |dlogit| 1.01e-5 (results/hf_parity.json)


def test_logits_match_transformers():
    model, _, ref, _, (logits, _) = loaded("gemma4")
    cfg = model.cfg
    assert (cfg.sliding_layers, cfg.sliding_window, cfg.layer_form) == ((0,), 8, "gemma4")
    assert dict(cfg.global_layer) == dict(head_dim=32, n_kv_heads=1, k_eq_v=True,
                                          rope_type="proportional", rope_theta=1e6,
                                          partial_rotary_factor=0.25)
    err = float(np.abs(np.asarray(logits) - ref["logits"]).max())
    assert err <= LOGIT_TOL, f"max |dlogit| = {err:.2e}"
    # the soft-cap (4) bends them: the largest is well past its linear range
    assert 2.0 < np.abs(ref["logits"]).max() < 4.0


def test_router_scores_and_expert_sets_match():
    """Recorded scores are softmax of transformers' router logits (hooked on router.proj);
    the top-k sets are its; the weights carry the per-expert scales."""
    model, params, ref, _, (_, coeffs) = loaded("gemma4")
    probs = np.asarray(coeffs["router"]).reshape(ref["router_logits"].shape)
    # 2e-5: logits of std 3 (margins far above noise) turn the residual stream's ~1e-6
    # rounding differences into 5.6e-6 in the second layer's probabilities
    np.testing.assert_allclose(probs, jax.nn.softmax(ref["router_logits"], -1), atol=2e-5)
    k = model.cfg.top_k
    ours = np.sort(np.asarray(llm.selected_experts(model.cfg, params, coeffs["router"])), -1)
    theirs = np.sort(np.argsort(-ref["router_logits"], -1)[..., :k], -1)
    np.testing.assert_array_equal(ours.reshape(theirs.shape), theirs)
    p = params["layers"][0]["moe"]
    experts, weights = llm.route(model.cfg, coeffs["router"][0], p)
    top = jnp.take_along_axis(coeffs["router"][0], experts, -1)
    np.testing.assert_allclose(weights, top / top.sum(-1, keepdims=True)
                               * p["expert_scale"][experts], rtol=1e-6)


def test_replay_is_bitwise_and_the_router_site_is_used():
    """Record and replay through one compiled program (a Given argument, as the audit calls
    it): unchanged scores replay bitwise; scores swapped between examples change the logits."""
    model, params, ref, apply, (logits, coeffs) = loaded("gemma4")
    run = jax.jit(lambda p, t, g: model.apply(p, t, g))
    rec = run(params, ref["input_ids"], coeffs_lib.recording(coeffs_lib.zeros_like(coeffs)))
    rep = run(params, ref["input_ids"], coeffs_lib.replaying(rec[1]))
    chex.assert_trees_all_equal(rep, rec)
    assert run._cache_size() == 1
    swapped = {"router": jnp.flip(coeffs["router"], axis=1)}
    out, used = apply(params, ref["input_ids"], swapped)
    chex.assert_trees_all_equal(used, swapped)
    assert float(jnp.max(jnp.abs(out - logits))) > 1e-2


def test_decoding_equals_the_forward():
    """A 5-token prefill, then one token a step to 14 (past the window of 8, so the sliding
    layer's cache masks by position), gives the forward's logits at every position; each
    layer's cache has its own heads; greedy generation continues as the forward's argmax."""
    from dynjax import decoding

    model, params, ref, apply, (logits, _) = loaded("gemma4")
    cfg, ids = model.cfg, jnp.asarray(ref["input_ids"][:, :14])
    B = ids.shape[0]
    prefill = jax.jit(lambda p, t: decoding.prefill(cfg, p, t, 14)[:2])
    step = jax.jit(lambda p, c, t, i: decoding.decode_step(cfg, p, c, t, i)[:2])
    first, cache = prefill(params, ids[:, :5])
    assert [c["k"].shape[2:] for c in cache] == [(2, 16), (1, 32)]
    steps = []
    for i in range(5, 14):
        out, cache = step(params, cache, ids[:, i], jnp.full((B,), i))
        steps.append(out)
    stepped = jnp.concatenate([first, jnp.stack(steps, 1)], 1)
    np.testing.assert_allclose(stepped, np.asarray(logits)[:, :14], atol=2e-5, rtol=0)
    gen = np.asarray(jax.jit(lambda p, t: decoding.generate(cfg, p, t, 6))(params, ids[:, :6]))
    np.testing.assert_array_equal(gen[:, :6], ref["input_ids"][:, :6])
    assert_greedy_is_the_forwards_argmax(apply, params, gen, ref["input_ids"])


def test_wrapper_towers_are_skipped_by_name():
    from dynjax.loaders import tensors

    path = str(DATA / "gemma4")
    t = tensors.Tensors(path, hf.read_config(path), log=lambda line: None)
    skipped = {n for names in t.skipped.values() for n in names}
    assert any(n.startswith("model.vision_tower.") for n in skipped)
    assert any(n.startswith("model.embed_vision.") for n in skipped)
    assert "model.layers.1.router.per_expert_scale" in t


def test_full_layer_heads_from_either_spelling():
    """transformers 5's per_layer_config and the Hub's global_head_dim /
    num_global_key_value_heads give the same config."""
    cfg = hf.read_config(str(DATA / "gemma4"))
    text = dict(cfg["text_config"])
    per_layer = text.pop("per_layer_config")
    assert per_layer == {"1": {"head_dim": 32, "num_key_value_heads": 1}}
    hub = dict(cfg, text_config=dict(text, global_head_dim=32, num_global_key_value_heads=1))
    assert hf.config_from_hf(hub) == hf.config_from_hf(cfg)


@pytest.mark.parametrize("changes,fragment", [
    ({"hidden_size_per_layer_input": 256}, "per-layer input embeddings"),
    ({"num_kv_shared_layers": 1}, "reusing earlier layers"),
    ({"use_bidirectional_attention": "all"}, "causal text attention"),
    ({"per_layer_config": {"0": {"head_dim": 32}, "1": {"head_dim": 32}}}, "per_layer_config"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "yarn", "factor": 2.0,
                                                "original_max_position_embeddings": 8},
                          "full_attention": {"rope_type": "default"}}}, "rope_type='yarn'"),
])
def test_config_refuses_what_it_does_not_compute(changes, fragment):
    cfg = hf.read_config(str(DATA / "gemma4"))
    cfg = dict(cfg, text_config=dict(cfg["text_config"], **changes))
    with pytest.raises(ConfigError, match=fragment):
        hf.config_from_hf(cfg)


def test_reap_reads_the_inputs_the_experts_get(monkeypatch):
    """REAP's saliency (audit.expert_importance) recomputes each MoE layer's expert input:
    for Gemma-4 it is the experts' own norm of the residual after the normed attention
    update, in each layer's config: equal to what the forward hands llm.moe_ffn."""
    from dynjax.audit import expert_importance

    model, params, ref, _, (_, coeffs) = loaded("gemma4")
    seen, moe_ffn = [], llm.moe_ffn

    def recording(cfg, p, x, *args, **kwargs):
        seen.append(x)
        return moe_ffn(cfg, p, x, *args, **kwargs)
    monkeypatch.setattr(llm, "moe_ffn", recording)
    tokens = jnp.asarray(ref["input_ids"])

    def forward_inputs(p, t, c):   # the recorded scores, as REAP replays them; one program
        seen.clear()
        model.apply(p, t, c)
        return list(seen)
    forward = jax.jit(forward_inputs)(params, tokens, coeffs)
    ours = jax.jit(lambda p, t, c: expert_importance._llm_moe_inputs(model.cfg, p, t, c))(
        params, tokens, coeffs)
    assert len(forward) == len(ours) == 2
    for x, y in zip(forward, ours):
        np.testing.assert_allclose(y, x, atol=1e-6, rtol=0)
