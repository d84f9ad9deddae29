"""CPU speed-ups that must not change results: per-token projections train like the 3-D
form (bitwise on the CPU they were made on; within float rounding on an AVX2-only CPU,
where XLA:CPU's matmul kernels sum a weight gradient in another order); block-causal attention
equals the full T x T form within float tolerance."""

import os
import pathlib
import re
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dynjax.models import build, gates, mudd, transformer
from dynjax.models.transformer import ModelConfig, causal_attention
from dynjax.train.lm import make_train_step
from tests.conftest import perturbed

ROOT = pathlib.Path(__file__).resolve().parents[2]
B, T = 2, 32
BASE = dict(d_model=32, n_heads=2, n_layers=2, d_ff=64, attn_block=8)
# MoD at k = 8 routed tokens per example: at k <= 4 XLA:CPU's tiny-matmul emitter sums the
# 3-D form's weight gradient in another order (1 ulp), so the two forms differ there.
FAMILIES = [("gates", "feature_gate", {}), ("mod", "mod", {"mod_capacity": 0.25}),
            ("moe", "moe", {}), ("mudd", "mudd", {})]
# The training comparisons run blockwise attention in two query blocks: each block is its own
# code in the train step (4 blocks of 8 took ~45% longer to compile than 2 of 16).
TRAIN_BLOCK = 16


def tokens(seed=0):
    return jax.random.randint(jax.random.key(seed), (B, T), 0, 256)


def cfg_of(family, variant, **kw):
    return ModelConfig.from_dict({"family": family, "variant": variant, **BASE, **kw})


def init(model):
    """Parameters with every leaf perturbed (NumPy's noise: no program to compile):
    FeatureGate's controller starts at zero, which would make its gates independent of the
    features under test."""
    return perturbed(model.init(jax.random.key(0), tokens()), seed=1, scale=0.3)


def train(cfg, params, steps=2):
    """``steps`` AdamW steps of ``cfg``'s model from ``params`` (one compiled step)."""
    model = build(cfg)
    tx = optax.adamw(1e-2)
    step = jax.jit(make_train_step(model, tx))
    state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}
    for i in range(steps):
        state, _ = step(state, tokens(i))
    return state["params"]


_AS_IS = {}


def trained_as_is(family, variant, extra):
    """(initial parameters, ``train`` from them with the code as it is), once per family: the
    start and the reference that each rewritten form below trains from and is compared with
    (call it before monkeypatching). The initial parameters do not depend on the form: one
    init program per family, not one per form."""
    key = (family, variant, tuple(sorted(extra.items())))
    if key not in _AS_IS:
        cfg = cfg_of(family, variant, attn_block=TRAIN_BLOCK, **extra)
        params = build(cfg).init(jax.random.key(0), tokens())
        _AS_IS[key] = params, train(cfg, params)
    return _AS_IS[key]


@pytest.mark.parametrize("family,variant,extra", FAMILIES)
def test_per_token_projections_train_like_3d(family, variant, extra, monkeypatch):
    """Two training steps' parameters. Bitwise equal on the CPU where the rewrite was
    measured; on an AVX2-only AMD EPYC 0.3-0.6% of the embedding's entries differ by up to
    4.3e-7, so the promise is float rounding (a wrong reshape moves them by ~lr = 1e-2)."""
    cfg = cfg_of(family, variant, attn_block=TRAIN_BLOCK, **extra)
    start, flat = trained_as_is(family, variant, extra)
    unflat = lambda layer, x: layer(x)  # the (B, T, ...) form the projections had before
    monkeypatch.setattr(transformer, "per_token", unflat)
    monkeypatch.setattr(mudd, "per_token", unflat)
    chex.assert_trees_all_close(flat, train(cfg, start), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family,variant,extra", FAMILIES)
def test_rotary_table_trains_bitwise_like_per_token_angles(family, variant, extra, monkeypatch):
    cfg = cfg_of(family, variant, attn_block=TRAIN_BLOCK, **extra)
    start, table = trained_as_is(family, variant, extra)
    per_token_angles = transformer.token_positions
    monkeypatch.setattr(transformer, "token_positions",
                        lambda cfg, index, bound=None: per_token_angles(cfg, index))
    chex.assert_trees_all_equal(table, train(cfg, start))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's fusion decision")
def test_compiled_forward_evaluates_rotary_angles_once_per_position():
    """Not once per layer, head and dimension, as XLA:CPU does when it fuses the angles into
    each layer's rotation (5-6% of a CPU forward)."""
    cfg = cfg_of("gates", "dense", n_layers=3, scan_layers=False)
    model = build(cfg)
    params = jax.eval_shape(model.init, jax.random.key(0), tokens())   # lowering needs shapes
    hlo = jax.jit(lambda p, t: model.apply(p, t)[0]).lower(params, tokens()).compile().as_text()
    evaluated = sorted(line.split("=")[1].split("{")[0].strip() + " " + op
                       for line in hlo.splitlines() for op in ("sine(", "cosine(")
                       if f" {op}" in line)
    half = cfg.head_dim // 2
    assert evaluated == [f"f32[{T},{half}] cosine(", f"f32[{T},{half}] sine("]


def _reductions_in_ynn_fusions(hlo: str) -> int:
    """``reduce`` instructions inside the computations that YNNPACK fusions call."""
    called = set(re.findall(r"%ynn_fusion[\w.]* = .*?calls=%([\w.\-]+)", hlo))
    count, current = 0, None
    for line in hlo.splitlines():
        header = re.match(r"^%([\w.\-]+) ", line)
        if header:
            current = header.group(1)
        elif current in called and " reduce(" in line:
            count += 1
    return count


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="an XLA:CPU option")
def test_mudd_trains_without_ynnpack_reductions():
    """train.py compiles MUDD's step without XLA:CPU's YNNPACK reduce fusions (its
    backward's sums over streams ran 2x slower in them); other families keep the default."""
    from configs import mudd_tiny, tiny
    from dynjax.train.lm import Training

    def hlo(config):
        config.train.batch_size, config.data.seq_len = B, T
        config.model.update(BASE)
        task = Training(config)
        state = jax.eval_shape(lambda: task.init_state(jax.random.key(0)))
        return task.train_step().lower(state, tokens()).compile().as_text()

    assert _reductions_in_ynn_fusions(hlo(mudd_tiny.get_config("mudd"))) == 0
    assert _reductions_in_ynn_fusions(hlo(tiny.get_config("feature_gate"))) > 0


def test_block_causal_and_fused_attention_equal_full():
    """Each form compiled as one program (as the models run it), not op by op."""
    attention = jax.jit(causal_attention, static_argnums=5)
    fused = jax.jit(transformer.fused_attention, static_argnums=5)
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (B, T, 2, 8)) for key in (kq, kk, kv))
    plain = jnp.broadcast_to(jnp.arange(T), (B, T))
    # MoD's gathered tokens: original positions in order, unused slots at EMPTY (discarded)
    gathered = jnp.sort(jax.random.choice(jax.random.key(1), 4 * T, (T,), replace=False))
    gathered = jnp.broadcast_to(jnp.where(jnp.arange(T) % 7 == 3, 2 ** 30, gathered), (B, T))
    for pos in (plain, gathered):
        full_out, full_lse, _ = attention(q, k, v, pos, pos, 0)
        real = pos < 2 ** 30
        for out, lse in (attention(q, k, v, pos, pos, 8)[:2],
                         fused(q, k, v, pos, pos, "xla")):
            np.testing.assert_allclose(jnp.where(real[..., None, None], out, 0),
                                       jnp.where(real[..., None, None], full_out, 0), atol=1e-5)
            np.testing.assert_allclose(jnp.where(real[:, None], lse, 0),
                                       jnp.where(real[:, None], full_lse, 0), atol=1e-5)
    # the backward pass too (plain positions)
    loss = lambda block: lambda q, k, v: jnp.sum(
        causal_attention(q, k, v, plain, plain, block)[0] * v)
    grad = lambda block: jax.jit(jax.grad(loss(block), argnums=(0, 1, 2)))(q, k, v)
    chex.assert_trees_all_close(grad(8), grad(0), atol=1e-5)


@pytest.mark.parametrize("family,variant,extra", [  # MoD's causal route leaves unused slots
    ("gates", "feature_gate", {}), ("mod", "mod", {"mod_route": "router", "mod_capacity": 0.5})])
def test_block_causal_models_equal_full(family, variant, extra):
    cfg = cfg_of(family, variant, **extra)
    model = build(cfg)
    params = init(model)
    full = build(cfg.replace(attn_block=0))
    (got, coeffs), (want, want_coeffs) = (jax.jit(m.apply)(params, tokens())
                                          for m in (model, full))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)  # f32 rounding, amplified
    chex.assert_trees_all_close(coeffs, want_coeffs, atol=1e-4, rtol=1e-4)


def test_fused_attention_and_online_features_equal_jnp():
    """attn_impl="xla" (jax.nn.dot_product_attention; "cudnn" is the same call on a GPU) and
    FeatureGate's online-softmax features against the jnp form."""
    cfg = cfg_of("gates", "feature_gate", attn_block=0)
    params = init(build(cfg))
    fused = cfg.replace(attn_impl="xla", attn_block=8)  # 4 key blocks online
    (got, coeffs), (want, want_coeffs) = (jax.jit(build(c).apply)(params, tokens())
                                          for c in (fused, cfg))
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    chex.assert_trees_all_close(coeffs, want_coeffs, atol=1e-4, rtol=1e-4)


def test_online_row_features_equal_blockwise():
    q, k, qp, kp = (jax.random.normal(key, (B, T, 2, 8)) for key in jax.random.split(
        jax.random.key(2), 4))
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    # each form compiled as one program, as the models run it (not op by op)
    _, lse_prev, _ = jax.jit(causal_attention)(qp, kp, kp, pos, pos)
    prev = (qp, kp, lse_prev)
    _, lse, want = jax.jit(lambda q, k, prev: causal_attention(
        q, k, k, pos, pos, 8, gates.attention_row_features(prev)))(q, k, prev)
    got, got_lse = jax.jit(lambda q, k, prev: gates.online_row_features(
        q, k, pos, prev, block=8))(q, k, prev)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(got_lse, lse, atol=2e-5, rtol=1e-5)


@pytest.mark.subprocess
@pytest.mark.parametrize("setting", ["retain", "hugetlb", "system", None])
def test_entry_points_reexec_with_the_allocator_setting(setting):
    """A program that calls runtime.setup(__name__) runs with the setting without being told
    (None: DYNJAX_MALLOC unset, the default)."""
    from dynjax import runtime
    env = {k: v for k, v in os.environ.items()
           if k not in ("GLIBC_TUNABLES", "DYNJAX_MALLOC", "DYNJAX_MALLOC_APPLIED")}
    if setting:
        env["DYNJAX_MALLOC"] = setting
    code = ("from dynjax.runtime import setup; setup(__name__); import os; "
            "print(os.environ.get('GLIBC_TUNABLES'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, timeout=60,
                         capture_output=True, text=True, check=True).stdout
    want = runtime.SETTINGS[setting or runtime.DEFAULT].get("GLIBC_TUNABLES")
    assert out.strip() == str(want)


@pytest.mark.subprocess
@pytest.mark.parametrize("setting", ["retain", "hugetlb", "system", None])
def test_env_sh_sets_what_alloc_sets(setting):
    """scripts/env.sh (sourced by the shell scripts, twice here: it is idempotent) and
    dynjax/runtime.py give the same GLIBC_TUNABLES, also on top of one already set."""
    from dynjax import runtime
    for before in ({}, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}):
        env = dict({k: v for k, v in os.environ.items()
                    if k not in ("GLIBC_TUNABLES", "DYNJAX_MALLOC")}, **before)
        if setting:
            env["DYNJAX_MALLOC"] = setting
        out = subprocess.run(["bash", "-c", "source scripts/env.sh; source scripts/env.sh; "
                              "echo \"${GLIBC_TUNABLES:-None}\""], env=env, cwd=ROOT,
                             timeout=30, capture_output=True, text=True, check=True).stdout
        want = runtime.environment(setting or runtime.DEFAULT, before).get("GLIBC_TUNABLES")
        assert out.strip() == str(want)
