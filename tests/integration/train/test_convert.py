"""train.init_from: dense -> MoD (fitted routers), dense -> MoE / MoDE (upcycled experts).

What is promised and tested: copied parameters are the source's bits; a converted MoD with
every token entering (capacity 1.0) computes h + w(r) * F(h) with the dense F (so the dense
model's logits exactly when w = 1); an upcycled MoE layer computes (sum of the kept routing
weights) * the dense MLP, hence the dense model whenever those weights sum to one; the router
rule ranks tokens by their update's size (not ties); a mismatched source is one line; the
source is recorded; a resumed converted run is bitwise the uninterrupted one and never
converts again.
"""
import functools
import os
import shutil
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from dynjax.runs import rundir
from dynjax.data import text as text_data
from dynjax.errors import ConfigError
from dynjax.jsonio import read_jsonl
from dynjax.models import build
from dynjax.models.transformer import Block, Embed, Head, window_positions
from dynjax.train import convert, loop
from tests.conftest import ROOT, tiny_config

T = 32


def _model(family, variant, **overrides):
    c = tiny_config("dense")
    c.model.update(dict(family=family, variant=variant, **overrides))
    return build(c.model.to_dict())


@pytest.fixture(scope="module")
def windows():
    return text_data.eval_windows(text_data.load_splits("embedded")["train"], T, 32)


@pytest.fixture(scope="module")
def dense(windows):
    """A dense source (gates family, scanned layers): its model and seeded params."""
    model = _model("gates", "dense")
    return model, model.init(jax.random.key(1), jnp.zeros((1, T), jnp.int32))


def _convert(dense, windows, family, variant, **overrides):
    model = _model(family, variant, **overrides)
    init = model.init(jax.random.key(2), jnp.zeros((1, T), jnp.int32))
    params, report = convert.convert(dense[0].cfg, dense[1], model.cfg, init, windows=windows)
    return model, params, report


def _blocks(cfg, params):
    """Per block, its parameter tree (layout-free), and the embedding / head trees."""
    values = convert._values(cfg, params)
    trees = [traverse_util.unflatten_dict({p: v for (b, p), v in values.items() if b == i})
             for i in range(cfg.n_layers)]
    return trees, params["embed"], params["head"]


@pytest.mark.parametrize("family, variant", [("mod", "mod"), ("moe", "moe"),
                                             ("moe", "mode_integrated"), ("mod", "mode_staged")])
def test_copied_parameters_are_the_sources(dense, windows, family, variant):
    model, params, report = _convert(dense, windows, family, variant, mod_capacity=0.25)
    src, out = _blocks(dense[0].cfg, dense[1]), _blocks(model.cfg, params)
    chex.assert_trees_all_equal(src[1:], out[1:])           # embedding, head
    staged = set(convert.mod_lib.mod_layer_ids(model.cfg)) if variant == "mode_staged" else set()
    for b, (s, o) in enumerate(zip(src[0], out[0])):
        chex.assert_trees_all_equal({k: s[k] for k in ("attn", "attn_norm", "mlp_norm")},
                                    {k: o[k] for k in ("attn", "attn_norm", "mlp_norm")})
        if "moe" in o:      # every expert is the dense MLP, bit for bit
            assert family == "moe" or b in staged
            E = model.cfg.moe.num_experts
            chex.assert_trees_all_equal(o["moe"]["wi"], np.stack([s["mlp"]["up"]["kernel"]] * E))
            chex.assert_trees_all_equal(o["moe"]["wo"], np.stack([s["mlp"]["down"]["kernel"]] * E))
        else:
            chex.assert_trees_all_equal(s["mlp"], o["mlp"])
    expected = {"mod": "mod", "moe": "moe_upcycle", "mode_integrated": "moe_upcycle",
                "mode_staged": "mod+moe_upcycle"}[variant]
    assert report["conversion"] == expected


def test_upcycle_noise_perturbs_experts_apart(dense, windows):
    model = _model("moe", "moe")
    init = model.init(jax.random.key(2), jnp.zeros((1, T), jnp.int32))
    params, _ = convert.convert(dense[0].cfg, dense[1], model.cfg, init, noise=0.01, seed=3)
    wi, up = params["layers"]["moe"]["wi"][0], dense[1]["layers"]["block"]["mlp"]["up"]["kernel"][0]
    rel = np.abs(wi - up[None]).std() / up.std()
    assert 0.005 < rel < 0.02 and not np.allclose(wi[0], wi[1])


def _mod_reference(cfg, params, tokens):
    """h + sigmoid(w.h) * F(h) in each MoD block, h + F(h) elsewhere, from the block trees
    (one compiled program: op by op, each of its ops compiled on its own)."""
    return jax.jit(functools.partial(_mod_forward, cfg))(_blocks(cfg, params), tokens)


def _mod_forward(cfg, blocks, tokens):
    trees, embed, head = blocks
    positions = window_positions(cfg, *tokens.shape)
    h = Embed(cfg).apply({"params": embed}, tokens)
    for b, tree in enumerate(trees):
        block = {k: tree[k] for k in ("attn", "attn_norm", "mlp_norm", "mlp")}
        u = Block(cfg).apply({"params": block}, h, positions)[0]
        if "router" in tree:
            u = jax.nn.sigmoid(h @ tree["router"]["proj"]["kernel"]) * u
        h = h + u
    return Head(cfg).apply({"params": head}, h)


def test_mod_with_every_token_entering_is_dense_up_to_the_router_weight(dense, windows):
    """Capacity 1.0: every token enters every MoD block, which then computes h + w(r) F(h)
    with the dense F (attention over all tokens, in order). So the converted model equals the
    dense model with each MoD block's update scaled by sigmoid(r) (the reference below), and
    with the raw weight and the router scores replayed as 1 it IS the dense model."""
    tokens = jnp.asarray(windows[:4])
    model, params, _ = _convert(dense, windows, "mod", "mod", mod_capacity=1.0)
    logits = _forward(model, params, tokens)
    reference = _mod_reference(model.cfg, params, tokens)
    chex.assert_trees_all_close(logits, reference, atol=2e-5, rtol=2e-5)
    raw = build(model.cfg.replace(mod_router_weight="raw"))
    coeffs = jax.eval_shape(raw.apply, params, tokens)[1]   # the scores' shapes: all ones
    ones = jax.tree.map(lambda c: jnp.ones(c.shape, c.dtype), coeffs)
    dense_logits = _forward(*dense, tokens)
    chex.assert_trees_all_close(_forward(raw, params, tokens, ones), dense_logits,
                                atol=2e-5, rtol=2e-5)
    # and not trivially: the recorded (fitted) router weights change the function
    assert float(jnp.abs(logits - dense_logits).max()) > 1e-3


def _forward(model, params, tokens, coeffs=None):
    return jax.jit(lambda p, t, c: model.apply(p, t, coeffs=c)[0])(params, tokens, coeffs)


@pytest.mark.parametrize("variant, k", [("moe", 4), ("moe", 1), ("mode_integrated", 1)])
def test_upcycled_moe_is_dense_when_routing_weights_sum_to_one(dense, windows, variant, k):
    """Identical experts: a layer's FFN is (sum of its kept routing weights) * MLP_dense. With
    nothing dropped (capacity factor 0) the weights sum to one when every expert is chosen
    (k = E, softmax), or when the router's probabilities are replayed one-hot on a real
    expert; top-1 routing with the recorded probabilities gives p_top < 1 and differs."""
    tokens = jnp.asarray(windows[:4])
    model, params, _ = _convert(dense, windows, "moe", variant, moe_num_experts_per_tok=k,
                                moe_capacity_factor=0.0)
    dense_logits = _forward(*dense, tokens)
    recorded = jax.jit(model.apply)(params, tokens)
    if variant == "moe" and k == model.cfg.moe.num_experts:
        chex.assert_trees_all_close(recorded[0], dense_logits, atol=2e-5, rtol=2e-5)
        return
    assert float(jnp.abs(recorded[0] - dense_logits).max()) > 1e-3
    probs = recorded[1]["router"]
    one_hot = jax.nn.one_hot(jnp.argmax(probs[..., :model.cfg.moe.num_experts], -1),
                             probs.shape[-1], dtype=probs.dtype)
    replayed = _forward(model, params, tokens, {"router": one_hot})
    chex.assert_trees_all_close(replayed, dense_logits, atol=2e-5, rtol=2e-5)


def test_router_rule_ranks_tokens_by_their_update_not_by_ties(dense, windows):
    """The fitted router's top-k overlaps the top-k by ||F(h)|| far above chance (c), its
    scores are distinct, and about a fraction c of tokens ask to enter (score > 0)."""
    model, params, report = _convert(dense, windows, "mod", "mod", mod_capacity=0.25)
    (fit,) = report["routers"].values()
    assert fit["topk_overlap"] > 0.35 and fit["router_r2"] > 0.1, fit   # chance: c = 0.25
    assert 0.1 < fit["router_asks"] < 0.5 and 0.1 < fit["predictor_asks"] < 0.5, fit
    scores = jax.jit(model.apply)(params, jnp.asarray(windows[:4]))[1]["router"]
    # tokens of a window's leading run of one byte ("ll...") have equal causal contexts, so
    # equal scores in exact arithmetic; every other token's score is its own
    runs = [int(np.argmax(np.append(w != w[0], True))) for w in windows[:4]]
    for layer in np.asarray(scores).reshape(-1, 4, T):
        distinct = [len(np.unique(s)) for s in layer]
        assert all(d >= T - run + 1 for d, run in zip(distinct, runs)), (distinct, runs)


def test_router_target_puts_a_fraction_c_above_zero():
    rng = np.random.default_rng(0)
    update = rng.standard_normal((64, T, 8)) * rng.lognormal(size=(64, T, 1))
    z = convert.router_target(update, 0.125, 2.0)
    assert abs(np.mean(z > 0) - 0.125) < 0.01
    big = np.linalg.norm(update, axis=-1)
    assert np.corrcoef(z.ravel(), np.log(big).ravel())[0, 1] > 0.999


@pytest.mark.parametrize("family, variant, overrides, message", [
    ("mod", "mod", {"d_ff": 96}, "model.d_ff: source 64, target 96"),
    ("moe", "moe", {"n_layers": 2}, "model.n_layers: source 3, target 2"),
    ("gates", "feature_gate", {}, "block 0 controller"),
])
def test_a_mismatched_source_is_refused_naming_each_parameter(dense, windows, family, variant,
                                                              overrides, message):
    """Refused from the shapes alone (convert.plan), so the target's init is its shapes."""
    model = _model(family, variant, **overrides)
    init = jax.eval_shape(model.init, jax.random.key(2), jnp.zeros((1, T), jnp.int32))
    with pytest.raises(ConfigError, match=message):
        convert.convert(dense[0].cfg, dense[1], model.cfg, init, windows=windows)


def test_a_source_with_parts_the_target_lacks_is_refused(dense, windows):
    model, params, _ = _convert(dense, windows, "mod", "mod")
    with pytest.raises(ConfigError, match="the source's block 1 router/proj/kernel has no place"):
        convert.convert(model.cfg, params, dense[0].cfg, dense[1])


# ------------------------------------------------------------------ through train.py / the loop

def _target(source, steps, family="moe", variant="moe"):
    c = tiny_config("dense")
    c.model.update(dict(family=family, variant=variant))
    c.train.update(dict(steps=steps, init_from=str(source), init_report_windows=8,
                        init_calibration_windows=16))
    return c


@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("source")
    c = tiny_config("dense")
    c.model.update(dict(family="mod"))          # the MoD family's dense layout, grouped blocks
    c.train.steps = 3
    loop.train(c, str(run), progress=False)
    return run


@pytest.fixture(scope="module")
def converted_straight(source_run, tmp_path_factory):
    run = tmp_path_factory.mktemp("converted")
    loop.train(_target(source_run, 6), str(run), progress=False)
    return run


def test_run_records_its_source_and_the_loss_jump(source_run, converted_straight):
    record = rundir.read_config(converted_straight).train.init_source
    src = rundir.load(source_run)
    assert (record.path, record.step) == (str(source_run.resolve()), 3)
    assert record.params_sha256 == rundir.params_sha256(src.params)
    (jump,) = [r for r in read_jsonl(converted_straight / rundir.METRICS)
               if r.get("split") == "conversion"]
    assert jump["step"] == 0 and jump["conversion"] == "moe_upcycle"
    assert jump["jump_bpb"] == pytest.approx(jump["converted"]["bpb"] - jump["source"]["bpb"])
    assert jump["source"]["windows"] == 8


def test_resume_after_conversion_is_bitwise_and_does_not_convert_again(
        source_run, converted_straight, tmp_path):
    """Stopped after its step-3 checkpoint (the uninterrupted run cut back to it: killed
    before the step-6 save) and resumed with the source moved away: the same bits as the
    uninterrupted run (a resume that converted again would restart from the source)."""
    run = tmp_path / "run"
    shutil.copytree(converted_straight, run)
    shutil.rmtree(run / "checkpoints" / "6")
    (run / rundir.EVAL).unlink()
    moved = tmp_path / "elsewhere"
    shutil.move(str(source_run), moved)
    try:
        loop.train(_target(source_run, 6), str(run), progress=False)
    finally:
        shutil.move(str(moved), source_run)
    chex.assert_trees_all_equal(rundir.load(run).params, rundir.load(converted_straight).params)
    assert rundir.read_config(run).train.init_source.step == 3


def test_a_changed_source_step_is_refused(source_run, converted_straight):
    c = _target(f"{source_run}:3", 6)
    with pytest.raises(ConfigError, match="was converted from train.init_from="):
        loop.train(c, str(converted_straight), progress=False)


def _cli(args, timeout=180):
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, JAX_PLATFORMS="cpu"))


@pytest.mark.subprocess
@pytest.mark.parametrize("extra, message", [
    (["--config.model.d_ff=96"], "model.d_ff: source 64, target 96"),
    (["--config.train.init_from={src}:2"], "has no checkpoint step 2 (saved: 1, 3); pass one"),
    (["--config.train.init_from=/absent"], "/absent does not exist; give a train.py run directory"),
    (["--config.train.init_from=tests/data/hf/llama"], "the source (llm/llama) cannot become a mod model"),
])
def test_train_cli_refuses_a_mismatched_source_in_one_line(source_run, tmp_path, extra, message):
    args = ["--config=configs/mod_tiny.py:mod", f"--workdir={tmp_path / 'run'}",
            f"--config.train.init_from={source_run}", "--config.model.d_model=32",
            "--config.model.n_heads=2", "--config.model.d_ff=64", "--config.model.n_layers=3",
            "--config.data.seq_len=32", "--config.train.batch_size=8", "--config.train.steps=1",
            "--config.train.warmup_steps=0"]
    args += [e.format(src=source_run) for e in extra]
    out = _cli(args)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.startswith("train.py: error: ")]
    assert len(lines) == 1 and message in lines[0], out.stderr[-2000:]
    assert not (tmp_path / "run").exists()
