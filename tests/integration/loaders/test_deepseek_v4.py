"""DeepSeek-V4's own pieces against transformers' modules (tests/data/deepseek_v4_parts.npz,
made by scripts/make_deepseek_v4_reference.py; no torch needed): manifold-constrained
hyper-connections (pre, post, Sinkhorn comb, the layer's mix, the head), and their
coefficient sites recording and replaying bitwise in one compiled program."""
from __future__ import annotations

import functools
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax import coeffs as coeffs_lib
from dynjax.models.components import hyper
from dynjax.models.components.experts import clamped_glu

REFERENCE = pathlib.Path(__file__).parents[3] / "tests" / "data" / "deepseek_v4_parts.npz"
DIMS = hyper.Dims(hidden_size=16, hc=4, sinkhorn_iters=20, eps=1e-6, norm_eps=1e-6)


@functools.lru_cache(maxsize=None)
def reference():
    data = dict(np.load(REFERENCE))
    hc = {"fn": data["hc.fn"].T, "base": data["hc.base"], "scale": data["hc.scale"]}
    head = {"fn": data["head.fn"].T, "base": data["head.base"], "scale": data["head.scale"]}
    return data, jax.tree.map(jnp.asarray, hc), jax.tree.map(jnp.asarray, head)


def block(x):
    """A stand-in block whose output depends on its input (so pre matters downstream)."""
    return jnp.tanh(x) * 1.5


@jax.jit
def around(p, h, given):
    return hyper.around(DIMS, p, h, block, given)


def test_hyper_connection_equals_transformers():
    """pre/post/comb, the collapsed input and the mixed streams of one decoder site."""
    data, p, _ = reference()
    w = jax.jit(functools.partial(hyper.weights, DIMS))(p, jnp.asarray(data["hc.h"]))
    np.testing.assert_allclose(w["post"], data["hc.post"], rtol=0, atol=2e-6)
    np.testing.assert_allclose(w["comb"], data["hc.comb"], rtol=0, atol=2e-6)
    np.testing.assert_allclose(hyper.collapse(w["pre"], jnp.asarray(data["hc.h"])),
                               data["hc.collapsed"], rtol=0, atol=2e-6)
    mixed = hyper.expand(w["post"], w["comb"], jnp.asarray(data["hc.h"]),
                         jnp.asarray(data["hc.out"]))
    np.testing.assert_allclose(mixed, data["hc.mixed"], rtol=0, atol=5e-6)
    # the fixture is not degenerate: coefficients vary by token, comb is far from uniform
    assert float(jnp.std(w["post"], axis=(0, 1)).min()) > 0.05
    assert float(jnp.abs(w["comb"] - 0.25).max()) > 0.2


def test_comb_is_doubly_stochastic():
    """Columns sum to 1 (Sinkhorn ends on them); rows nearly (20 iterations on sharp
    softmaxes leave this fixture's rows within 0.05, as transformers' do)."""
    data, p, _ = reference()
    comb = hyper.weights(DIMS, p, jnp.asarray(data["hc.h"]))["comb"]
    np.testing.assert_allclose(comb.sum(-2), 1.0, atol=1e-5)
    np.testing.assert_allclose(comb.sum(-1), 1.0, atol=0.06)
    np.testing.assert_allclose(data["hc.comb"].sum(-1), 1.0, atol=0.06)
    assert float(comb.min()) >= 0


def test_head_equals_transformers():
    data, _, head = reference()
    y, used = jax.jit(functools.partial(hyper.head, DIMS))(head, jnp.asarray(data["hc.h"]), None)
    np.testing.assert_allclose(y, data["head.y"], rtol=0, atol=2e-6)
    assert used["pre"].shape == (2, 7, 4)


def test_sites_record_and_replay_bitwise():
    """Record, replay the record (bitwise), and replay edited matrices: the given comb is
    applied as is (no Sinkhorn on replay), in the same compiled program."""
    data, p, _ = reference()
    h = jnp.asarray(data["hc.h"])
    y, used = around(p, h, coeffs_lib.recording(coeffs_lib.zeros_like(
        jax.eval_shape(lambda: hyper.weights(DIMS, p, h)))))
    y2, used2 = around(p, h, coeffs_lib.replaying(used))
    chex.assert_trees_all_equal((y, used), (y2, used2))
    flat = dict(used, comb=jnp.full_like(used["comb"], 0.25), post=jnp.ones_like(used["post"]),
                pre=jnp.full_like(used["pre"], 0.5))
    y3, used3 = around(p, h, coeffs_lib.replaying(flat))
    chex.assert_trees_all_equal(used3, flat)
    expected = block(0.5 * h.sum(-2))[..., None, :] + jnp.broadcast_to(
        h.mean(-2, keepdims=True), h.shape)
    np.testing.assert_allclose(y3, expected, rtol=0, atol=1e-6)
    assert around._cache_size() == 1


def test_schema_axes():
    for axes in (hyper.PRE_AXES, hyper.COMB_AXES, hyper.HEAD_AXES):
        assert "token" in axes and "example" in axes and "hc" in axes
    assert hyper.COMB_AXES.index("hc_in") == 3


def test_routers_and_clamped_swiglu_equal_transformers():
    """V4's sqrt-softplus top-k router (selection-only bias), its hash router (tid2eid) and
    the clamped SwiGLU against transformers' modules."""
    from dynjax.models import deepseek_v4 as v4
    data, _, _ = reference()
    cfg = v4.Config(num_experts=8, top_k=2, routed_scaling_factor=1.5, swiglu_limit=1.5)
    p = {"router": jnp.asarray(data["router.weight"].T), "router_bias": jnp.asarray(
        data["router.bias"])}
    x = jnp.asarray(data["router.x"])
    scores = v4.router_scores(p, x)
    experts, w = v4.route(cfg, p, scores, None)
    np.testing.assert_array_equal(np.sort(experts, -1), np.sort(data["router.idx"], -1))
    order = np.argsort(np.asarray(experts), -1), np.argsort(data["router.idx"], -1)
    np.testing.assert_allclose(np.take_along_axis(np.asarray(w), order[0], -1),
                               np.take_along_axis(data["router.w"], order[1], -1), atol=1e-6)
    hashed = {"router": p["router"], "tid2eid": jnp.asarray(data["hash.table"], jnp.int32)}
    experts, w = v4.route(cfg, hashed, scores, jnp.asarray(data["hash.ids"]))
    np.testing.assert_array_equal(experts, data["hash.idx"])
    np.testing.assert_allclose(w, data["hash.w"], atol=1e-6)
    xm = jnp.asarray(data["mlp.x"])
    y = clamped_glu(xm @ data["mlp.gate"].T, xm @ data["mlp.up"].T, 1.5) \
        @ data["mlp.down"].T
    np.testing.assert_allclose(y, data["mlp.y"], atol=2e-6)


def test_v32_lightning_indexer_equals_transformers():
    """DeepSeek-V3.2's indexer (components.indexer): its causal top-3 and its full ranking
    of every key equal transformers' DeepseekV32Indexer's."""
    from dynjax.models.components import indexer
    data, _, _ = reference()
    H, d = 4, 12
    p = {"q_b": data["idx.q_b"].T.reshape(10, H, d), "k": data["idx.k"].T,
         "k_norm": data["idx.k_norm"], "k_norm_bias": data["idx.k_norm_bias"],
         "weights": data["idx.weights"].T}
    half = data["idx.cos"].shape[-1] // 2
    s = jax.jit(indexer.scores)(jax.tree.map(jnp.asarray, p), jnp.asarray(data["idx.x"]),
                                jnp.asarray(data["idx.q_res"]),
                                jnp.asarray(data["idx.cos"][..., :half]),
                                jnp.asarray(data["idx.sin"][..., :half]))
    # transformers' ranking orders our scores (ties, e.g. all heads at relu 0, in any order)
    ranked = np.take_along_axis(np.asarray(s), data["idx.rank"].astype(np.int64), -1)
    assert (np.diff(ranked, axis=-1) <= 0).all()
    assert (np.diff(ranked, axis=-1) < -1e-4).mean() > 0.5     # mostly distinct scores
    T = s.shape[-1]
    causal = np.tril(np.ones((T, T), bool))
    chosen = np.asarray(indexer.select(s, causal, 3))
    expected = np.zeros_like(chosen)
    np.put_along_axis(expected, data["idx.top3"].astype(np.int64), True, -1)
    np.testing.assert_array_equal(chosen, expected & causal)
    masked = np.sort(np.where(causal, np.asarray(s), -np.inf), -1)[..., ::-1]
    assert float((masked[:, 3:, 2] - masked[:, 3:, 3]).min()) > 1e-4   # top-3 margins


# ------------------------------------------------------------------ the whole model (port)

from dynjax.loaders import deepseek_v4 as v4_loader  # noqa: E402
from dynjax.models import deepseek_v4 as v4  # noqa: E402
from tests.conftest import (assert_cache_decoding_equals_forward,  # noqa: E402
                            assert_parity_figure_reproduces)

CHECKPOINT = pathlib.Path(__file__).parents[3] / "tests" / "data" / "hf" / "deepseek_v4"


@functools.lru_cache(maxsize=None)
def port():
    """The committed tiny transformers checkpoint, its reference, and one compiled apply
    that records (a zeros Given) and replays."""
    model, params = v4_loader.load(str(CHECKPOINT))
    ref = dict(np.load(CHECKPOINT / "reference.npz"))
    apply = jax.jit(model.apply)
    ids = jnp.asarray(ref["input_ids"])
    shapes = jax.eval_shape(model.apply, params, ids)[1]
    logits, coeffs = apply(params, ids, coeffs_lib.recording(coeffs_lib.zeros_like(shapes)))
    return model, params, ref, apply, logits, coeffs


def test_the_architecture_layout_reads_v4():
    """deepseek_v4 is a plug-in of dynjax.loaders.archs (its own model through its port):
    hf.load and open_target reach DeepseekV4; the params are what param_table says (shapes,
    logical axes, counts); a config.json that disagrees with a tensor is one line."""
    import dataclasses

    from dynjax.errors import CheckpointError
    from dynjax.loaders import archs, hf, tensors
    from dynjax.audit.targets import open_target
    assert "deepseek_v4" in archs.SUPPORTED
    model, params = port()[:2]
    assert isinstance(model, v4.DeepseekV4) and model.cfg.model_type == "deepseek_v4"
    rows = {p: s for p, s, _ in v4.param_table(model.cfg)}
    flat = {tuple(getattr(k, "key", getattr(k, "idx", None)) for k in path): a
            for path, a in jax.tree_util.tree_flatten_with_path(params)[0]}
    assert {p: tuple(a.shape) for p, a in flat.items()} == {p: tuple(s) for p, s in rows.items()}
    assert flat[("layers", 0, "moe", "tid2eid")].dtype == jnp.int32
    assert v4.param_count(model.cfg)["total"] == sum(a.size for a in flat.values())
    specs = model.logical_axes()
    assert jax.tree.structure(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)
                              ) == jax.tree.structure(params)
    target = open_target(str(CHECKPOINT))
    assert target.kind == "hf" and isinstance(target.model, v4.DeepseekV4)
    assert target.family == "deepseek_v4" and target.label == "deepseek_v4/deepseek_v4"
    bad = dataclasses.replace(model.cfg, moe_intermediate_size=10)
    with pytest.raises(CheckpointError, match="config.json implies"):
        hf.params_from_tensors(bad, tensors.Tensors(str(CHECKPOINT), hf.read_config(
            str(CHECKPOINT))))


def test_fp4_experts_dequantise_to_the_unpacked_model():
    """tests/data/hf/deepseek_v4_fp4 ships its experts as V4-Flash does (int8 pairs of e2m1,
    an F8_E8M0 ``.scale`` per row and 32 inputs, quantization_config expert_dtype fp4):
    hf.load dequantises them on load, and the forward equals transformers' float32 forward
    of the same model holding those FP4 values unpacked; the expert sets are its own."""
    from dynjax.loaders import tensors
    path = CHECKPOINT.parent / "deepseek_v4_fp4"
    raw = tensors.SafetensorsFile(str(path / "model.safetensors"))
    w = "model.layers.1.ffn.experts.3.w2.weight"
    assert raw.dtype(w) == np.int8 and raw.entries[w][1] == (32, 16)
    assert raw.dtype(w[:-7] + ".scale").name == "float8_e8m0fnu"
    model, params, ref, logits, coeffs = fp4_port()
    ids = jnp.asarray(ref["input_ids"])
    err = float(np.abs(np.asarray(logits) - ref["logits"]).max())
    assert err <= 1e-5, f"max |dlogit| {err:.3g}"
    assert_parity_figure_reproduces("deepseek_v4_fp4", err)
    experts, _ = v4.route(model.cfg, params["layers"][1]["moe"], coeffs["router"][0], ids)
    np.testing.assert_array_equal(np.sort(experts, -1), np.sort(ref["experts"][1], -1))
    down = np.asarray(params["layers"][1]["moe"]["experts"]["down"])
    assert len(np.unique(down)) > 10 and np.all(np.isin(np.abs(down / np.exp2(np.floor(
        np.log2(np.abs(down) + (down == 0))))), [0, 1, 1.5]))   # e2m1 mantissas times 2^e


def test_logits_equal_transformers():
    """float32 logits of a 4-layer model (HCA, CSA, sliding, CSA; 2 hash-routed layers); the
    figure is results/hf_parity.json's."""
    _, _, ref, _, logits, _ = port()
    err = float(np.abs(np.asarray(logits) - ref["logits"]).max())
    assert err <= 1e-4, f"max |dlogit| {err:.3g}"
    row = assert_parity_figure_reproduces("deepseek_v4", err)
    assert row["top_k_sets_equal"] and row["indexer_selections_equal"]
    assert float(np.std(ref["logits"])) > 0.1      # the reference is not flat


def test_expert_sets_and_indexer_selections_equal_transformers():
    model, params, ref, _, _, coeffs = port()
    cfg, ids = model.cfg, jnp.asarray(ref["input_ids"])
    chosen = v4.selected_experts(cfg, params, coeffs, ids)
    for i, kind in enumerate(cfg.mlp_layer_types):
        np.testing.assert_array_equal(np.sort(chosen[i], -1), np.sort(ref["experts"][i], -1),
                                      err_msg=f"layer {i} ({kind})")
    positions = jnp.arange(ids.shape[1])
    for j, scores in enumerate(coeffs["indexer"]):
        chosen = np.asarray(v4.index_select(cfg, scores, positions))
        idx = ref["index"][j]
        expected = np.zeros_like(chosen)
        for b, t, s in zip(*np.nonzero(idx >= 0)):
            expected[b, t, idx[b, t, s]] = True
        np.testing.assert_array_equal(chosen, expected, err_msg=f"indexer {j}")
        # the selection is a real choice: some queries see more entries than they keep
        assert (expected.sum(-1) < np.asarray(v4.visible_entries(
            cfg.csa_rate, scores.shape[-1], positions)).sum(-1)).any()


def test_hash_layers_route_by_the_table():
    """A hash layer's experts are tid2eid[token] whatever the scores: the same token gets
    the same experts in every context, and replayed scores change only the weights."""
    model, params, ref, _, _, coeffs = port()
    p = params["layers"][0]["moe"]
    ids = jnp.asarray(ref["input_ids"])
    e1, w1 = v4.route(model.cfg, p, coeffs["hash_router"][0], ids)
    e2, w2 = v4.route(model.cfg, p, coeffs["hash_router"][0][::-1], ids)
    chex.assert_trees_all_equal(e1, e2, np.asarray(p["tid2eid"])[np.asarray(ids)])
    assert float(jnp.abs(w1 - w2).max()) > 1e-3


def test_replay_is_bitwise_in_one_program():
    model, params, ref, apply, logits, coeffs = port()
    ids = jnp.asarray(ref["input_ids"])
    logits2, coeffs2 = apply(params, ids, coeffs_lib.replaying(coeffs))
    chex.assert_trees_all_equal((logits, coeffs), (logits2, coeffs2))
    # replayed indexer scores drive the selection: reversing the entries' scores changes it
    edited = dict(coeffs, indexer=-coeffs["indexer"])
    logits3, _ = apply(params, ids, coeffs_lib.replaying(edited))
    assert float(jnp.abs(logits3 - logits).max()) > 1e-3
    assert apply._cache_size() == 1
    coeffs_lib.check(coeffs, model.schema)


@functools.lru_cache(maxsize=None)
def fp4_port():
    """The FP4 fixture loaded (dequantised) once, its reference and its jitted forward."""
    from dynjax.loaders import hf
    path = CHECKPOINT.parent / "deepseek_v4_fp4"
    model, params = hf.load(str(path), jnp.float32)
    ref = dict(np.load(path / "reference.npz"))
    logits, coeffs = jax.jit(model.apply)(params, jnp.asarray(ref["input_ids"]))
    return model, params, ref, logits, coeffs


@pytest.mark.parametrize("name", ["deepseek_v4", "deepseek_v4_fp4"])
def test_cache_decoding_equals_the_forward_and_transformers(name):
    """dynjax.decoding on V4's cache (a window of keys per layer, each compressor's open
    window and entries, the indexer's keys): a 9-token prefill then one token a step, and
    20 steps from an empty cache, give the forward's logits at every position (windows of
    4 and 8 close inside the prefill and during the steps; the sliding window of 6 wraps
    its ring); greedy generation equals transformers' generate."""
    from dynjax import decoding
    if name == "deepseek_v4":
        model, params, ref, _, logits, _ = port()
    else:
        model, params, ref, logits, _ = fp4_port()
    cfg, ids = model.cfg, jnp.asarray(ref["input_ids"], jnp.int32)
    (B, T), P = ids.shape, 9
    cache = assert_cache_decoding_equals_forward(cfg, params, ids, logits, P)
    # what the cache holds: a ring of W - 1 keys per layer, a compressor's open window
    # (2 series for CSA, its previous first series too), one entry per `rate` positions
    W, hd, d = cfg.sliding_window, cfg.head_dim, cfg.index_head_dim
    per_row = 0
    for kind in cfg.layer_types:
        per_row += (W - 1) * hd
        if kind == "heavily_compressed_attention":
            per_row += 2 * cfg.hca_rate * hd + T // cfg.hca_rate * hd
        elif kind == "compressed_sparse_attention":
            per_row += sum(6 * cfg.csa_rate * n + T // cfg.csa_rate * n for n in (hd, d))
    assert decoding.cache_bytes(cache) == 4 * B * per_row
    greedy = ref["greedy"]
    prompt = jnp.asarray(greedy[:, :greedy.shape[1] - 8], jnp.int32)
    out = jax.jit(lambda p, t: decoding.generate(cfg, p, t, 8))(params, prompt)
    np.testing.assert_array_equal(np.asarray(out), greedy)


def test_config_defaults_and_refusals():
    cfg = v4.config_from_hf({"model_type": "deepseek_v4", "num_hidden_layers": 5,
                             "compress_ratios": [0, 4, 128, 4, 128], "num_hash_layers": 2})
    assert cfg.layer_types[:3] == ("sliding_attention", "compressed_sparse_attention",
                                   "heavily_compressed_attention")
    assert cfg.mlp_layer_types == ("hash_moe",) * 2 + ("moe",) * 3
    assert (cfg.hc, cfg.hc_sinkhorn_iters, cfg.index_topk, cfg.rope_dim) == (4, 20, 512, 64)
    default = v4.config_from_hf({"model_type": "deepseek_v4"})
    assert default.n_layers == 43 and default.layer_types[:3] == (
        "heavily_compressed_attention",) * 2 + ("heavily_compressed_attention",)
    import pytest
    from dynjax.errors import ConfigError
    from dynjax.loaders import hf
    with pytest.raises(ConfigError, match="'gptq'"):   # FP8 / FP4 load (hf.md, Formats)
        hf.config_from_hf({"model_type": "deepseek_v4",
                           "quantization_config": {"quant_method": "gptq"}})
    with pytest.raises(ConfigError, match="scoring_func"):
        v4.config_from_hf({"model_type": "deepseek_v4", "scoring_func": "softmax"})


def test_recent_keys_keeps_the_most_recent_visible_entries():
    """The indexers' static control (interventions.recent_keys): replayed, every query keeps
    its index_topk most recent visible entries; the other families are untouched."""
    from dynjax.audit import interventions
    model, params, ref, apply, logits, coeffs = port()
    cfg = model.cfg
    recent = interventions.recent_keys(coeffs, model.schema)
    chex.assert_trees_all_equal({k: v for k, v in recent.items() if k != "indexer"},
                                {k: v for k, v in coeffs.items() if k != "indexer"})
    positions = jnp.arange(ref["input_ids"].shape[1])
    n = coeffs["indexer"].shape[-1]
    visible = np.asarray(v4.visible_entries(cfg.csa_rate, n, positions))
    count = visible.sum(-1)
    expected = (np.arange(n)[None, :] >= count[:, None] - cfg.index_topk) & visible
    for scores in recent["indexer"]:
        np.testing.assert_array_equal(v4.index_select(cfg, scores, positions),
                                      np.broadcast_to(expected, scores.shape))
    replayed, _ = apply(params, jnp.asarray(ref["input_ids"]), coeffs_lib.replaying(recent))
    assert np.isfinite(np.asarray(replayed)).all()
    assert float(jnp.abs(replayed - logits).max()) > 1e-4
    assert apply._cache_size() == 1
