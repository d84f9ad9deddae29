"""train.init_from=HF_DIR: a dense Llama / Qwen3 upcycled into MoE, or continued as MoD
(configs/llm_convert.py, dynjax/train/convert.py), on the committed tiny random fixtures.

What is promised and tested: the target's architecture comes from the source's config.json;
copied parameters are the source's bits and every expert is the layer's dense MLP; with the
two top-k weights renormalised the upcycled model's first forward is the dense model's (up to
float rounding), and without it is not; a MoD layer with every token entering computes
h + sigmoid(r) (a + m) with the dense a + m, so the dense model when the weight is replayed
as 1; the fitted router ranks tokens by their update's size; MoD replay is bitwise under jit;
config.json records the source (step "hf", the digest); a resumed conversion is bitwise the
uninterrupted run and needs no source; a mismatched source is one line before the run
directory exists.
"""
import dataclasses
import functools
import os
import shutil
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from dynjax.runs import rundir
from dynjax.configs import llm_convert
from dynjax.data import text as text_data
from dynjax.errors import ConfigError
from dynjax.jsonio import read_jsonl
from dynjax.loaders import hf
from dynjax.models import build, llm, moe_ffn
from dynjax.train import convert, init_from, loop
from tests.conftest import ROOT

DATA = os.path.join(ROOT, "tests", "data", "hf")
T = 32
_SOURCES: dict = {}


def _source(arch):
    """(model, params) of a committed fixture, loaded once."""
    if arch not in _SOURCES:
        _SOURCES[arch] = hf.load(os.path.join(DATA, arch))
    return _SOURCES[arch]


def _resolved(variant, source, **model):
    """configs/llm_convert.py:VARIANT resolved against ``source`` (the llm family's hook)."""
    c = llm_convert.get_config(variant)
    c.train.init_from = source
    c.model.update(model)
    return init_from.fill_from_source(ml_collections.ConfigDict(c.to_dict()))


def _target(variant, arch, **model):
    return build(_resolved(variant, os.path.join(DATA, arch), **model).model.to_dict())


@pytest.fixture(scope="module")
def windows():
    return text_data.eval_windows(text_data.load_splits("embedded")["train"], T, 32)


def _convert(arch, variant, windows, noise=0.0, **model):
    src_model, src = _source(arch)
    target = _target(variant, arch, **model)
    init = target.init(jax.random.key(2))
    params, report = convert.convert(src_model.cfg, src, target.cfg, init, windows=windows,
                                     noise=noise, seed=3)
    return target, params, report


def _forward(model, params, tokens, coeffs=None):
    return jax.jit(lambda p, t, c: model.apply(p, t, coeffs=c)[0])(params, tokens, coeffs)


def _outside_layers(tree):
    return {k: v for k, v in tree.items() if k != "layers"}


ATTN = ("attn", "input_norm", "post_norm")


# ------------------------------------------------------------------ the config takes the source's

def test_the_architecture_comes_from_the_source():
    for arch in ("llama", "qwen3"):
        want = hf.config_from_hf(hf.read_config(os.path.join(DATA, arch)))
        moe = _resolved("moe", os.path.join(DATA, arch)).model
        assert {f: moe[f] for f in llm.ARCHITECTURE} == \
            {f: getattr(want, f) for f in llm.ARCHITECTURE}
        assert moe.moe_layers == tuple(range(want.n_layers))
        assert moe.moe_intermediate_size == want.intermediate_size
        assert (moe.num_experts, moe.top_k, moe.norm_topk_prob) == (8, 2, True)
        assert _resolved("mod", os.path.join(DATA, arch)).model.mod_layers == (1,)
    set_by_hand = _resolved("mod", os.path.join(DATA, "llama"), hidden_size=32, mod_layers=(0,))
    assert (set_by_hand.model.hidden_size, set_by_hand.model.mod_layers) == (32, (0,))
    with pytest.raises(ConfigError, match="taken from train.init_from's config.json"):
        _resolved("moe", "")
    with pytest.raises(ConfigError, match="model.vocab_size=128: train.py feeds bytes"):
        _resolved("moe", os.path.join(DATA, "llama"), vocab_size=128)


# ------------------------------------------------------------------ upcycling

@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_upcycled_experts_and_copies_are_the_sources_bitwise(arch, windows):
    src_model, src = _source(arch)
    model, params, report = _convert(arch, "moe", windows)
    assert report["conversion"] == "moe_upcycle"
    chex.assert_trees_all_equal(_outside_layers(params), _outside_layers(src))
    E = model.cfg.num_experts
    for s, o in zip(src["layers"], params["layers"]):
        chex.assert_trees_all_equal({k: o[k] for k in ATTN}, {k: s[k] for k in ATTN})
        for name in ("gate", "up", "down"):     # every expert is the dense MLP, bit for bit
            chex.assert_trees_all_equal(o["moe"]["experts"][name], np.stack([s["mlp"][name]] * E))
        assert "mlp" not in o and o["moe"]["router"].shape == (src_model.cfg.hidden_size, E)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_upcycled_first_forward_is_the_dense_models_when_top_k_renormalises(arch, windows):
    """Identical experts: an MoE layer computes (sum of its k kept weights) x MLP(x). The
    config renormalises them to sum 1 (norm_topk_prob), so the first forward is the dense
    model's up to float rounding; with the raw softmax weights (about k/E of the mass) it is
    not."""
    tokens = jnp.asarray(windows[:4])
    src_model, src = _source(arch)
    model, params, _ = _convert(arch, "moe", windows)
    dense = _forward(src_model, src, tokens)
    err = float(jnp.abs(_forward(model, params, tokens) - dense).max())
    assert err < 2e-5 and float(jnp.abs(dense).max()) > 1.0, err
    raw = build(dataclasses.replace(model.cfg, norm_topk_prob=False))
    assert float(jnp.abs(_forward(raw, params, tokens) - dense).max()) > 1e-2


def test_upcycle_noise_perturbs_experts_apart(windows):
    _, src = _source("llama")
    _, params, _ = _convert("llama", "moe", windows, noise=0.01)
    up, experts = src["layers"][0]["mlp"]["up"], params["layers"][0]["moe"]["experts"]["up"]
    rel = float(np.std(experts - up[None]) / np.std(up))
    assert 0.005 < rel < 0.02 and not np.allclose(experts[0], experts[1])


def test_load_balance_is_switchs_and_one_when_balanced():
    rng = np.random.default_rng(0)
    probs = jax.nn.softmax(jnp.asarray(rng.standard_normal((2, 16, 4)), jnp.float32))
    experts = jax.lax.top_k(probs, 2)[1]
    share = np.bincount(np.asarray(experts).ravel(), minlength=4) / experts.size
    want = 4 * np.sum(share * np.asarray(probs).mean((0, 1)))
    assert float(moe_ffn.load_balance(probs, experts)) == pytest.approx(want, rel=1e-6)
    uniform = jnp.full((1, 4, 4), 0.25)
    assert float(moe_ffn.load_balance(uniform, jnp.arange(4).reshape(1, 4, 1))) == pytest.approx(1.0)


# ------------------------------------------------------------------ Mixture-of-Depths

def _mod_reference(cfg, params, tokens):
    """h + sigmoid(w.h) (a + m) in each MoD layer, h + a + m elsewhere, every token."""
    B, T_ = tokens.shape
    positions = llm.positions_at(cfg, jnp.broadcast_to(jnp.arange(T_), (B, T_)))
    h = jnp.take(params["embed"], tokens, axis=0)
    for p in params["layers"]:
        a, m, _, _ = llm.attention_then_ffn(cfg, p, h, positions, None)
        u = a + m
        if "router" in p:
            u = jax.nn.sigmoid(h @ p["router"]["proj"]["kernel"]) * u
        h = h + u
    return llm.head(cfg, params, llm.rms_norm(h, params["final_norm"], cfg.rms_norm_eps))


def test_mod_with_every_token_entering_is_dense_up_to_the_router_weight(windows):
    """Capacity 1.0: every token enters the MoD layer, which then computes h + w(r)(a + m)
    with the dense a + m (attention over all tokens, in order). So the converted model equals
    the dense model with that layer's update scaled by sigmoid(r), and with the raw weight
    and the router scores replayed as 1 it IS the dense model."""
    tokens = jnp.asarray(windows[:4])
    src_model, src = _source("llama")
    model, params, report = _convert("llama", "mod", windows, mod_capacity=1.0)
    assert report["conversion"] == "mod"
    chex.assert_trees_all_equal(_outside_layers(params), _outside_layers(src))
    for s, o in zip(src["layers"], params["layers"]):
        chex.assert_trees_all_equal({k: o[k] for k in (*ATTN, "mlp")},
                                    {k: s[k] for k in (*ATTN, "mlp")})
    logits = _forward(model, params, tokens)
    # one compiled program: op by op, each of its ops compiled on its own
    reference = jax.jit(functools.partial(_mod_reference, model.cfg))(params, tokens)
    chex.assert_trees_all_close(logits, reference, atol=2e-5, rtol=2e-5)
    raw = build(dataclasses.replace(model.cfg, mod_router_weight="raw"))
    coeffs = jax.eval_shape(raw.apply, params, tokens)[1]   # the scores' shapes: all ones
    ones = jax.tree.map(lambda c: jnp.ones(c.shape, c.dtype), coeffs)
    dense = _forward(src_model, src, tokens)
    chex.assert_trees_all_close(_forward(raw, params, tokens, ones), dense, atol=2e-5,
                                rtol=2e-5)
    assert float(jnp.abs(logits - dense).max()) > 1e-3   # the fitted weights do change it


def test_fitted_router_ranks_tokens_by_their_update(windows):
    """The converted model's own router scores follow the dense layer's log update norm (a
    seeded router's would not), and about a fraction c of the tokens ask to enter."""
    src_model, src = _source("llama")
    model, params, report = _convert("llama", "mod", windows, mod_capacity=0.25)
    fit = report["routers"]["1"]
    assert fit["topk_overlap"] > 0.4 and 0.05 < fit["router_asks"] < 0.5, fit
    _, us = convert.dense_trace(*convert.dense_steps(
        src_model.cfg, convert._values(src_model.cfg, src), T, 16), windows, 16)
    scores = np.asarray(jax.jit(model.apply)(params, jnp.asarray(windows))[1]["mod_router"][0])
    size = np.log(np.linalg.norm(us[1], axis=-1))
    assert np.corrcoef(scores.ravel(), size.ravel())[0, 1] > 0.5


def test_mod_replay_is_bitwise_and_uses_the_given_scores(windows):
    """Under every routing rule (top-k, and the causal router and predictor rules)."""
    converted, params, _ = _convert("qwen3", "mod", windows, mod_capacity=0.25)
    tokens = jnp.asarray(windows[:4])
    for route in ("topk", "router", "predictor"):
        apply = jax.jit(build(dataclasses.replace(converted.cfg, mod_route=route)).apply)
        logits, coeffs = apply(params, tokens)
        assert set(coeffs) == ({"mod_router", "mod_predictor"} if route == "predictor"
                               else {"mod_router"})
        replayed, again = apply(params, tokens, coeffs)
        chex.assert_trees_all_equal(replayed, logits)
        chex.assert_trees_all_equal(again, coeffs)
        flipped = jax.tree.map(jnp.negative, coeffs)   # the askers and the top-k turned over
        assert float(jnp.abs(apply(params, tokens, flipped)[0] - logits).max()) > 1e-4, route


def test_an_moe_source_into_a_dense_or_mod_target_is_refused(windows):
    src_model, src = _source("olmoe")
    for variant in ("dense", "mod"):
        model = _target(variant, "olmoe")
        with pytest.raises(ConfigError, match=r"block\(s\) \[0, 1\] are MoE layers in the "
                           "source \\(llm/moe\\) and dense MLPs in the target"):   # on shapes
            convert.plan(src_model.cfg, src, model.cfg,
                         jax.eval_shape(model.init, jax.random.key(0)))


# ------------------------------------------------------------------ through the loop

def _run_config(source, variant, steps):
    """Tiny runs; "dense" MoE dispatch compiles in 0.6x the time of "dropless" on a CPU (the
    two are equal in values and gradients: tests/integration/loaders/test_hf.py)."""
    c = llm_convert.get_config(variant)
    c.model.moe_dispatch = "dense"
    c.data.seq_len = T
    c.train.update(dict(steps=steps, batch_size=8, warmup_steps=1, log_every=2,
                        eval_every=1000, ckpt_every=2, init_from=str(source),
                        init_report_windows=8, init_calibration_windows=16))
    c.eval.update(dict(windows=16, batch_size=8, decode_check_windows=0))
    return c


@pytest.fixture(scope="module")
def hf_source(tmp_path_factory):
    """A copy of the llama fixture, which a test may move away."""
    return shutil.copytree(os.path.join(DATA, "llama"), tmp_path_factory.mktemp("hf") / "llama")


@pytest.fixture(scope="module")
def upcycled_straight(hf_source, tmp_path_factory):
    run = tmp_path_factory.mktemp("upcycled")
    loop.train(_run_config(hf_source, "moe", 4), str(run), progress=False)
    return run


def test_an_upcycled_run_records_its_source_and_starts_where_dense_ended(hf_source,
                                                                         upcycled_straight):
    config = rundir.read_config(upcycled_straight)
    record = config.train.init_source
    assert (record.path, record.step, record.family, record.model_type) == \
        (str(hf_source.resolve()), "hf", "llm", "llama")
    assert record.params_sha256 == rundir.params_sha256(hf.load(str(hf_source))[1])
    assert (config.model.hidden_size, config.model.moe_layers) == (48, [0, 1])
    records = read_jsonl(upcycled_straight / rundir.METRICS)
    (jump,) = [r for r in records if r.get("split") == "conversion"]
    assert jump["conversion"] == "moe_upcycle" and abs(jump["jump_bpb"]) < 1e-5, jump
    trained = [r for r in records if "loss" in r]
    assert trained and all("aux/load_balance" in r and len(r["moe_load_per_expert"]) == 2
                           for r in trained)


def test_resume_of_an_hf_conversion_is_bitwise_and_needs_no_source(hf_source, upcycled_straight,
                                                                   tmp_path):
    """Stopped after its step-2 checkpoint (the uninterrupted run cut back to it: killed
    before the step-4 save) and resumed with the source gone: the same bits as the
    uninterrupted run (the architecture comes from config.json, the parameters from the
    checkpoint; the source is never read again)."""
    run = tmp_path / "run"
    shutil.copytree(upcycled_straight, run)
    shutil.rmtree(run / "checkpoints" / "4")
    (run / rundir.EVAL).unlink()
    moved = tmp_path / "elsewhere"
    shutil.move(str(hf_source), moved)
    try:
        loop.train(_run_config(hf_source, "moe", 4), str(run), progress=False)
    finally:
        shutil.move(str(moved), hf_source)
    chex.assert_trees_all_equal(rundir.load(run).params, rundir.load(upcycled_straight).params)


def test_a_mod_conversion_trains_and_scores_every_route(hf_source, tmp_path):
    result = loop.train(_run_config(hf_source, "mod", 2), str(tmp_path / "run"), progress=False)
    test = result["test"]
    assert (test["route"], test["causal"]) == ("predictor", True)
    assert {r: v["causal"] for r, v in test["routes"].items()} == \
        {"topk": False, "router": True, "predictor": True}
    (jump,) = [r for r in read_jsonl(tmp_path / "run" / rundir.METRICS)
               if r.get("split") == "conversion"]
    assert jump["conversion"] == "mod" and set(jump["routers"]) == {"1"}


# ------------------------------------------------------------------ train.py refuses in one line

def _cli(args, timeout=240):
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, JAX_PLATFORMS="cpu"))


@pytest.fixture(scope="module")
def not_ported(tmp_path_factory):
    path = tmp_path_factory.mktemp("jamba")
    (path / "config.json").write_text('{"model_type": "jamba", "hidden_size": 48}')
    return path


@pytest.mark.subprocess
@pytest.mark.parametrize("variant, extra, message", [
    ("moe", ["--config.model.hidden_size=32"], "model.hidden_size: source 48, target 32"),
    ("mod", ["--config.model.n_layers=3"], "model.n_layers: source 2, target 3"),
    ("moe", ["--config.model.n_heads=2"], "model.n_heads: source 4, target 2"),
    ("dense", ["--config.train.init_from=tests/data/hf/olmoe"],
     "experts do not merge back into one MLP"),
    ("moe", ["--config.train.init_from={not_ported}"],
     "model_type='jamba' is not supported"),
    ("moe", ["--config.train.init_from=tests/data/hf/llama:5"],
     "a Hugging Face directory and holds one set of weights"),
    ("moe", ["--config.train.init_from="], "taken from train.init_from's config.json"),
])
def test_train_cli_refuses_a_mismatched_hf_source_in_one_line(tmp_path, not_ported, variant,
                                                              extra, message):
    args = [f"--config=configs/llm_convert.py:{variant}", f"--workdir={tmp_path / 'run'}",
            "--config.train.init_from=tests/data/hf/llama", "--config.data.seq_len=32",
            "--config.train.batch_size=8", "--config.train.steps=1",
            "--config.train.warmup_steps=0"]
    out = _cli(args + [e.format(not_ported=not_ported) for e in extra])
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.startswith("train.py: error: ")]
    assert len(lines) == 1 and message in lines[0], out.stderr[-2000:]
    assert not (tmp_path / "run").exists()
