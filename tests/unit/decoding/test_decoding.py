"""KV-cache decoding (dynjax.decoding) of every language-model family equals its forward.

One case per decoder path: static gates (layer_static; dense and uniform share it),
FeatureGate, fixed depth, MoD with a predictor and a slot budget (tests/unit/models/test_mod.py covers
the router rule), staged MoDE, MoE with binding capacity, integrated MoDE, MUDD. The unit tier
runs one of them (``UNIT``); the sweep over the others is
tests/integration/decoding/test_decoding_sweep.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax import decoding
from dynjax.measure import lm_execution, routing
from dynjax.models import build
from dynjax.models.transformer import ModelConfig
from tests.conftest import perturbed

B, T, P = 2, 12, 5
BASE = dict(d_model=32, n_heads=2, n_layers=2, d_ff=64, scan_layers=False)
CASES = {
    "gates/layer_static": dict(family="gates", variant="layer_static", scan_layers=True),
    "gates/feature_gate": dict(family="gates", variant="feature_gate", scan_layers=True),
    "gates/fixed_depth1": dict(family="gates", variant="fixed_depth", fixed_depth=1),
    "mod/predictor_budget": dict(family="mod", variant="mod", mod_route="predictor",
                                 mod_decode_slots=4),
    "mode_staged/top2": dict(family="mod", variant="mode_staged", mod_route="router",
                             moe_priority="position",
                             moe_num_experts_per_tok=2, moe_capacity_factor=0.0),
    # expert buffers of ceil(1.0 * 2 * T / 4) = 6 bind: decoding equals the forward over a
    # window of max_len = T with token-order buffers (see dynjax.decoding.moe)
    "moe/top2_binding": dict(family="moe", variant="moe", moe_num_experts_per_tok=2,
                             moe_capacity_factor=1.0),
    "mode_integrated/unlimited": dict(family="moe", variant="mode_integrated",
                                      moe_capacity_factor=0.0, scan_layers=True),
    "mudd/mudd": dict(family="mudd", variant="mudd"),
}
UNIT = ["gates/fixed_depth1"]   # the inner loop's case: the cheapest to compile
TOKENS = jax.random.randint(jax.random.key(0), (B, T), 0, 256)


def perturbed_params(model):
    """Initial parameters plus noise: the zero-initialised controllers (FeatureGate's, MUDD's
    DA) then vary with the input, as trained ones do. The noise is NumPy's and the init op by
    op: one jitted init-and-perturb per case compiled a program per case (~5 s each)."""
    return perturbed(model.init(jax.random.key(1), TOKENS), seed=2, scale=0.3)


def run_everything(cfg, fwd, params):
    """Every decoding path and the forward, as one jitted program (one compilation)."""
    full, coeffs = fwd.apply(params, TOKENS)
    cached, info = decoding.cached_forward(cfg, params, TOKENS)
    pre, cache, _ = decoding.prefill(cfg, params, TOKENS[:, :P], T)
    step, _, _ = decoding.decode_step(cfg, params, cache, TOKENS[:, P], jnp.full((B,), P))
    out = decoding.generate(cfg, params, TOKENS[:, :P], T - P)
    stats = (routing.routing_stats(fwd, params, TOKENS) if cfg.family == "mod" else
             lm_execution.moe_stats(fwd, params, TOKENS) if cfg.family == "moe" else {})
    return dict(full=full, coeffs=coeffs, cached=cached, info=info, prefill=pre, step=step,
                generated=out, again=fwd.apply(params, out)[0], stats=stats)


def check_decoding_equals_the_forward(case):
    """Teacher-forced, prefill-then-step and greedy decoding of ``CASES[case]`` equal its
    forward, and what ran per layer and token is what the forward did."""
    cfg = ModelConfig.from_dict({**BASE, **CASES[case]})
    fwd = build(decoding.forward_config(cfg))
    r = jax.jit(lambda p: run_everything(cfg, fwd, p))(perturbed_params(build(cfg)))
    full, info, stats = r["full"], r["info"], r["stats"]
    # Token by token (teacher forcing), a prompt in one pass, then a step from its cache.
    np.testing.assert_allclose(r["cached"], full, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(r["prefill"], full[:, :P], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(r["step"], full[:, P], atol=1e-4, rtol=1e-4)
    # What ran, per layer and token, is what the forward did.
    if "gate" in r["coeffs"]:
        np.testing.assert_allclose(info["gate"], r["coeffs"]["gate"], atol=1e-5)
        if cfg.variant == "feature_gate":
            assert np.std(np.asarray(info["gate"][-1])) > 1e-3   # the controller is live
    if cfg.family == "mod":
        np.testing.assert_array_equal(info["entered"], stats["entered"])
        assert 0 < np.mean(stats["entered"]) < 1
    if cfg.family == "moe":
        np.testing.assert_array_equal(info["ffn_ran"], stats["ffn_ran"])
        if cfg.moe.capacity_factor > 0:
            assert float(np.mean(stats["dropped"])) > 0         # the capacity really binds
    # Greedy generation: each new token is the forward's argmax after the tokens before it.
    out = r["generated"]
    np.testing.assert_array_equal(out[:, :P], TOKENS[:, :P])
    np.testing.assert_array_equal(out[:, P:], jnp.argmax(r["again"][:, P - 1:-1], -1))


@pytest.mark.parametrize("case", UNIT)
def test_decoding_equals_the_forward(case):
    check_decoding_equals_the_forward(case)


def test_cache_bytes_and_refusals():
    dense = ModelConfig(**BASE, variant="dense")
    assert decoding.cache_bytes(decoding.init_cache(dense, B, 64)) == 2 * 2 * B * 64 * 32 * 4
    fixed = dense.replace(variant="fixed_depth", fixed_depth=1)
    assert len(decoding.init_cache(fixed, B, 64)) == 1          # only the built blocks
    expert_choice = dense.replace(family="moe", variant="moe", moe_routing="expert_choice")
    with pytest.raises(NotImplementedError, match="expert_choice ranks the whole sequence"):
        decoding.init_cache(expert_choice, B, T)
    with pytest.raises(NotImplementedError, match="no KV-cache decoder"):
        decoding.init_cache(dense.replace(family="mlp"), B, T)
