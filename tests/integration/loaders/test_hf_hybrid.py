"""Qwen3-Next and Qwen3.5-MoE (Gated DeltaNet + gated attention) against transformers, and
every dynamic coefficient they carry as a site: router scores, shared-expert gates,
attention output gates, DeltaNet beta and decay.

Fixtures: tests/data/hf/qwen3_next, tests/data/hf/qwen3_5_moe and its dense sibling
tests/data/hf/qwen3_5 (the multimodal wrapper with a vision tower and MTP tensors), made by
scripts/make_hf_hybrid_fixtures.py."""
from __future__ import annotations

import dataclasses
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax import coeffs as coeffs_lib
from dynjax.loaders import hf
# loaded(arch): (model, params, reference, jitted apply, record)
from tests.integration.loaders.test_hf import assert_greedy_is_the_forwards_argmax, loaded

DATA = pathlib.Path(__file__).parents[3] / "tests" / "data" / "hf"
ARCHS = ("qwen3_next", "qwen3_5_moe", "qwen3_5")
LOGIT_TOL = 1e-4   # float32 max |dlogit|: 4.9e-5 (qwen3_next), 6.7e-6 (qwen3_5_moe), 4.3e-5 (qwen3_5)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(arch):
    model, _, ref, _, (logits, _) = loaded(arch)
    assert model.cfg.model_type == arch
    assert model.cfg.mixers == ("deltanet",) * 3 + ("attention",)
    err = float(np.abs(np.asarray(logits) - ref["logits"]).max())
    assert err <= LOGIT_TOL, f"{arch}: max |dlogit| = {err:.2e}"
    assert np.abs(ref["logits"]).max() > 1.0


@pytest.mark.parametrize("arch", ARCHS)
def test_coefficients_match_transformers(arch):
    """Top-k expert sets identical; router probabilities, DeltaNet beta and decay equal to
    transformers' (hooked) values; every family has the schema's axes (the dense Qwen3.5:
    no router or shared gate)."""
    model, _, ref, _, (_, coeffs) = loaded(arch)
    k = model.cfg.top_k
    if arch == "qwen3_5":
        assert set(coeffs) == {"attn_gate", "deltanet_beta", "deltanet_decay"}
    else:
        probs = np.asarray(coeffs["router"]).reshape(ref["router_logits"].shape)
        # 1e-4: layer-local errors are ~1e-6, amplified through the residual stream to 3.2e-5
        np.testing.assert_allclose(probs, jax.nn.softmax(ref["router_logits"], -1), atol=1e-4)
        ours = np.sort(np.argsort(-probs, -1)[..., :k], -1)
        np.testing.assert_array_equal(
            ours, np.sort(np.argsort(-ref["router_logits"], -1)[..., :k], -1))
        assert coeffs["shared_gate"].shape == (len(model.cfg.moe_layers),) + \
            ref["input_ids"].shape
    for name in ("deltanet_beta", "deltanet_decay"):
        np.testing.assert_allclose(coeffs[name], ref[name], atol=1e-4, rtol=1e-5)
    B, T = ref["input_ids"].shape
    cfg = model.cfg
    assert coeffs["attn_gate"].shape == (1, B, T, cfg.n_heads, cfg.head_dim)
    coeffs_lib.check(coeffs, model.schema)
    gates = np.asarray(coeffs["attn_gate"])    # spread over (0, 1): the gate matters
    assert gates.min() < 0.2 and gates.max() > 0.8


def test_chunk_size_does_not_change_the_function():
    """The chunked delta rule in chunks of 5 (six full, one partial) equals one chunk
    (2.8e-5 here: the layers' ~1e-6 rounding differences, amplified down the stack)."""
    model, params, ref, _, (logits, _) = loaded("qwen3_next")
    small = dataclasses.replace(model.cfg, deltanet_chunk=5)
    out, _ = jax.jit(lambda p, t: hf.build(small).apply(p, t))(params, ref["input_ids"])
    np.testing.assert_allclose(out, logits, atol=LOGIT_TOL, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_replay_is_bitwise_and_one_program(arch):
    """Record and replay through one compiled program with a Given argument (as the audit
    engine calls it): unchanged coefficients replay bitwise."""
    model, params, ref, _, (_, coeffs) = loaded(arch)
    run = jax.jit(lambda p, t, g: model.apply(p, t, g))
    zeros = coeffs_lib.zeros_like(coeffs)
    rec = run(params, ref["input_ids"], coeffs_lib.recording(zeros))
    rep = run(params, ref["input_ids"], coeffs_lib.replaying(rec[1]))
    chex.assert_trees_all_equal(rep, rec)
    assert run._cache_size() == 1


@pytest.mark.parametrize("name", ["attn_gate", "shared_gate", "deltanet_beta",
                                  "deltanet_decay", "router"])
def test_intervening_on_each_family_changes_the_logits(name):
    """Each coefficient family is used: replaying it with examples swapped changes the
    logits; the other families replayed unchanged keep theirs bitwise."""
    model, params, ref, apply, (logits, coeffs) = loaded("qwen3_5_moe")
    swapped = dict(coeffs, **{name: jnp.flip(coeffs[name], axis=1)})   # axis 1: example
    out, used = apply(params, ref["input_ids"], swapped)
    chex.assert_trees_all_equal(used, swapped)
    assert float(jnp.max(jnp.abs(out - logits))) > 1e-3, name


@pytest.mark.parametrize("arch", ARCHS)
def test_decoding_equals_the_forward(arch):
    """A 7-token prompt through the chunked prefill, then one token a step from its cache
    (DeltaNet conv + recurrent state, attention KV cache), gives the forward's logits at
    every position; greedy generation continues the prompt as the forward's argmax."""
    from dynjax import decoding

    model, params, ref, apply, (logits, _) = loaded(arch)
    cfg, ids = model.cfg, jnp.asarray(ref["input_ids"][:, :12])
    B = ids.shape[0]

    # prefill, each decode step and generation as separate programs: one program holding
    # all three hangs XLA:CPU (jax 0.10.2) at execution for qwen3_5 (a futex wait, no CPU)
    prefill = jax.jit(lambda p, t: decoding.prefill(cfg, p, t, 12)[:2])
    step = jax.jit(lambda p, c, t, i: decoding.decode_step(cfg, p, c, t, i)[:2])
    first, cache = prefill(params, ids[:, :7])
    steps = []
    for i in range(7, 12):
        out, cache = step(params, cache, ids[:, i], jnp.full((B,), i))
        steps.append(out)
    stepped = jnp.concatenate([first, jnp.stack(steps, 1)], 1)
    gen = jax.jit(lambda p, t: decoding.generate(cfg, p, t, 6))(params, ids[:, :6])
    np.testing.assert_allclose(stepped, np.asarray(logits)[:, :12], atol=5e-5, rtol=0)
    gen = np.asarray(gen)
    np.testing.assert_array_equal(gen[:, :6], ref["input_ids"][:, :6])
    assert_greedy_is_the_forwards_argmax(apply, params, gen, ref["input_ids"])


def test_wrapper_tensors_are_skipped_by_name():
    """Qwen3.5-MoE's vision tower and MTP block are skipped; the text model is read from
    under model.language_model. (a strict load would refuse any unread tensor)."""
    from dynjax.loaders import tensors

    t = tensors.Tensors(str(DATA / "qwen3_5_moe"), hf.read_config(str(DATA / "qwen3_5_moe")),
                        log=lambda line: None)
    skipped = {n for names in t.skipped.values() for n in names}
    assert any(n.startswith("model.visual.") for n in skipped)
    assert any(n.startswith("mtp.") for n in skipped)
    assert "model.layers.0.linear_attn.in_proj_qkv.weight" in t


def test_config_refuses_unknown_layer_types():
    from dynjax.errors import ConfigError

    cfg = hf.read_config(str(DATA / "qwen3_next"))
    cfg["layer_types"] = ["linear_attention", "sliding_attention", "linear_attention",
                          "full_attention"]
    with pytest.raises(ConfigError, match="layer_types"):
        hf.config_from_hf(cfg)
