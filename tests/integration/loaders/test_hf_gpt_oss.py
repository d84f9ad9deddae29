"""The gpt-oss port (``dynjax/loaders/archs/gpt_oss.py``) against transformers' float32
reference on the committed fixture tests/data/hf/gpt_oss (scripts/make_hf_fixtures.py):
the recorded coefficient is the router's logits (bias included) and equals transformers';
the fixture exercises every detail (sinks, the window, the clamp, the router bias: each
changes the logits); replay is bitwise and routes by the given logits. The logits'
parity, decoding and greedy generation are in tests/integration/loaders/test_hf.py (ARCHS)."""
from __future__ import annotations

import dataclasses
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np

from dynjax.models import llm
from tests.integration.loaders.test_hf import DATA, loaded


def test_config_maps_the_checkpoint():
    cfg = loaded("gpt_oss")[0].cfg
    assert (cfg.attention, cfg.router, cfg.experts) == ("gqa_sinks", "topk_softmax",
                                                       "clamped_swiglu")
    assert (cfg.sliding_window, cfg.sliding_layers, cfg.moe_layers) == (8, (0,), (0, 1))
    assert (cfg.swiglu_limit, cfg.swiglu_alpha, cfg.top_k) == (0.5, 1.702, 4)
    assert cfg.qkv_bias and cfg.o_bias
    assert (cfg.rope_type, cfg.rope_truncate, cfg.rope_factor) == ("yarn", False, 32.0)
    from dynjax.models.components import rotary
    assert rotary.attention_factor(cfg) == 0.1 * math.log(32.0) + 1
    assert llm.layer_config(cfg, 1).sliding_window == 0
    assert llm.layer_config(cfg, 0).sliding_window == 8


def test_router_logits_and_expert_sets_match():
    """The coefficient is transformers' router_logits (x W + b), within 2e-6; the top-4
    sets are the same on every token."""
    model, _, ref, _, (_, coeffs) = loaded("gpt_oss")
    logits = np.asarray(coeffs["router"]).reshape(ref["router_logits"].shape)
    np.testing.assert_allclose(logits, ref["router_logits"], atol=2e-6, rtol=0)
    k = model.cfg.top_k
    assert (np.sort(np.argsort(-logits, -1)[..., :k], -1)
            == np.sort(np.argsort(-ref["router_logits"], -1)[..., :k], -1)).all()


def test_router_weights_are_a_softmax_over_the_top_k():
    cfg = loaded("gpt_oss")[0].cfg
    z = jnp.asarray([[3.0, -1.0, 0.5, 2.0, 1.0, -4.0, 0.0, 2.5]])
    experts, weights = llm.route(cfg, z)
    np.testing.assert_array_equal(np.asarray(experts), [[0, 7, 3, 4]])
    np.testing.assert_allclose(np.asarray(weights),
                               np.asarray(jax.nn.softmax(jnp.asarray([[3.0, 2.5, 2.0, 1.0]]))),
                               rtol=1e-6)


def test_the_fixture_exercises_every_detail():
    """Each of the sinks, the window, the clamp and the router bias moves the logits by
    far more than the 6e-7 parity: the fixture could not pass without them."""
    model, params, ref, _, (logits, _) = loaded("gpt_oss")
    cfg = model.cfg
    no_sinks = jax.tree.map(lambda a: a, params)
    no_bias = jax.tree.map(lambda a: a, params)
    for layer_s, layer_b in zip(no_sinks["layers"], no_bias["layers"]):
        layer_s["attn"]["sinks"] = jnp.full_like(layer_s["attn"]["sinks"], -1e4)
        layer_b["moe"]["router_bias"] = jnp.zeros_like(layer_b["moe"]["router_bias"])
    variants = {"sinks": (cfg, no_sinks), "router bias": (cfg, no_bias),
                "window": (dataclasses.replace(cfg, sliding_window=0), params),
                "clamp": (dataclasses.replace(cfg, swiglu_limit=1e4), params)}
    run = jax.jit(lambda c, p: llm.forward(c, p, ref["input_ids"])[0], static_argnums=0)
    for name, (c, p) in variants.items():
        moved = np.abs(np.asarray(run(c, p)) - np.asarray(logits)).max()
        assert moved > 1e-2, (name, moved)


def test_replay_is_bitwise_and_routes_by_the_given_logits():
    model, params, ref, apply, (logits, coeffs) = loaded("gpt_oss")
    replayed, again = apply(params, ref["input_ids"], coeffs)
    chex.assert_trees_all_equal(replayed, logits)
    chex.assert_trees_all_equal(again, coeffs)
    swapped = jax.tree.map(lambda a: a[:, ::-1], coeffs)
    changed, used = apply(params, ref["input_ids"], swapped)
    chex.assert_trees_all_equal(used, swapped)
    assert np.abs(np.asarray(changed - logits)).max() > 1e-3


def test_mxfp4_experts_load_to_transformers_dequantised_logits():
    """tests/data/hf/gpt_oss_mxfp4: the experts stored as the Hub ships them
    (``gate_up_proj_blocks`` / ``_scales``, quantized by make_hf_fixtures.quantize_mxfp4);
    the reference is transformers after ``from_pretrained(..., Mxfp4Config(dequantize=True))``.
    dynjax's reader dequantizes to the same weights: the logits agree within 1e-5."""
    from dynjax.loaders import hf

    path = DATA / "gpt_oss_mxfp4"
    assert hf.read_config(str(path))["quantization_config"] == {"quant_method": "mxfp4"}
    stored = hf.Tensors(str(path)).source
    assert "model.layers.1.mlp.experts.gate_up_proj_blocks" in stored
    assert "model.layers.1.mlp.experts.gate_up_proj" not in stored
    model, params = hf.load(str(path))
    ref = np.load(path / "reference.npz")
    logits, coeffs = jax.jit(model.apply)(params, ref["input_ids"])
    assert np.abs(np.asarray(logits) - ref["logits"]).max() <= 1e-5
    assert np.abs(ref["logits"]).max() > 1.0
    np.testing.assert_allclose(np.asarray(coeffs["router"]).reshape(ref["router_logits"].shape),
                               ref["router_logits"], atol=1e-5, rtol=0)   # as the logits
