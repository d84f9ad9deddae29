"""MUDDPythia parity with the official PyTorch code, record/replay, loading.

Reference: tests/data/muddpythia_tiny.npz (see tests/data/README.md). Every tolerance is 1e-5
in float32; the reference's own NumPy reimplementation reaches about 1e-6. Bitwise replay of
the bfloat16 checkpoint: tests/integration/loaders/test_muddpythia_bf16.py.
"""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax import coeffs as coeffs_lib
from dynjax.models import muddpythia
from dynjax.loaders import muddpythia_hf

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "muddpythia_tiny.npz")
TOL = 1e-5
N_LAYER = 4

TINY_HF_CONFIG = {
    "model_type": "muddpythia", "block_size": 64, "vocab_size": 256, "n_layer": 4,
    "n_head": 4, "n_local_heads": 4, "dim": 64, "intermediate_size": None, "head_dim": 64,
    "rope_base": 10000, "norm_eps": 1e-5, "rotary_pct": 0.25, "use_qk_norm": True,
    "use_parallel_residual": True, "use_linear_bias": True, "dense": True,
    "dynamic_dense": True, "dense_type": "qkvr", "sepln": True, "expand_last": True,
    "round64": True, "stack_hidden": False, "tie_word_embeddings": False,
}


def write_tiny_hf_dir(path) -> str:
    """The tiny reference checkpoint as an HF directory (config.json, model.safetensors),
    written through the loader's :func:`muddpythia_hf.to_state_dict`; returns ``path``."""
    from safetensors.numpy import save_file

    os.makedirs(path, exist_ok=True)
    with np.load(DATA) as z:
        sd = {k[len("params/"):]: z[k] for k in z.files if k.startswith("params/")}
    cfg, params = muddpythia_hf.from_state_dict(sd, config=TINY_HF_CONFIG)
    save_file(muddpythia_hf.to_state_dict(cfg, params), os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(TINY_HF_CONFIG, f)
    return str(path)


def _max_err(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))


@pytest.fixture(scope="module")
def ref():
    with np.load(DATA) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def state_dict(ref):
    return {k[len("params/"):]: v for k, v in ref.items() if k.startswith("params/")}


@pytest.fixture(scope="module")
def model(state_dict):
    return muddpythia_hf.from_state_dict(state_dict)


@pytest.fixture(scope="module")
def recorded(model, ref):
    """One jitted record run in float32, with intermediates."""
    cfg, params = model
    logits, coeffs, inter = muddpythia.forward_jit(cfg, params, jnp.asarray(ref["input_ids"]))
    return jax.device_get((logits, coeffs, inter))


def test_config_inferred_from_shapes(model):
    cfg, _ = model
    assert cfg.ffn_widths == (128, 256, 256, 384)
    assert cfg.da_widths == (64, 64, 64, 64)
    assert (cfg.n_layer, cfg.dim, cfg.n_head, cfg.head_dim, cfg.rotary_dims) == (4, 64, 4, 16, 4)
    hash(cfg)  # a static jit argument


def test_config_rules_match_official_sizes(model):
    cfg, _ = model
    hf = muddpythia_hf.config_from_hf(TINY_HF_CONFIG)
    assert (hf.ffn_widths, hf.da_widths) == (cfg.ffn_widths, cfg.da_widths)
    big = muddpythia_hf.config_from_hf({"n_layer": 24, "dim": 2048, "n_head": 16,
                                     "vocab_size": 50432, "intermediate_size": None})
    assert big.ffn_widths[:3] == (4096, 4480, 4864) and big.ffn_widths[-1] == 12288
    assert big.da_widths == (64,) * 14 + (128,) * 10
    est = muddpythia.memory_time_estimate(big, n_windows=10, seq_len=2048, batch=2)
    assert est["param_count"] == 1_419_950_149   # the official class, instantiated on meta


def test_rope_table_is_fp16_rounded(model, ref):
    cos, sin = muddpythia.rope_table(model[0], 32)
    np.testing.assert_array_equal(cos, ref["rope/cos_sin_fp16"][:, :, 0])
    np.testing.assert_array_equal(sin, ref["rope/cos_sin_fp16"][:, :, 1])


def test_logits_match_reference(recorded, ref):
    assert _max_err(recorded[0], ref["logits"]) < TOL


def test_coefficients_match_reference(recorded, ref, model):
    _, coeffs, inter = recorded
    coeffs_lib.check(coeffs, muddpythia.schema(model[0]))
    for i in range(N_LAYER):
        assert coeffs["mix"][i].shape == ref[f"coef/total_{i}"].shape
        assert _max_err(coeffs["mix"][i], ref[f"coef/total_{i}"]) < TOL, i
        assert _max_err(inter["dynamic"][i], ref[f"coef/dynamic_{i}"]) < TOL, i


def test_hidden_states_and_streams_match_reference(recorded, ref):
    _, _, inter = recorded
    for j in range(N_LAYER + 1):
        assert _max_err(inter["hidden"][j], ref[f"hidden/{j}"]) < TOL, j
    for i in range(N_LAYER):
        assert _max_err(inter["streams"][i], ref[f"stream/{i}"]) < TOL, i


def check_replay_is_bitwise_equal_to_record_under_jit(state_dict, ref, dtype):
    """Replaying the recorded coefficients gives the logits and them bit for bit."""
    if dtype == "bfloat16":   # a bf16 checkpoint (like the released one) computes in bf16
        import ml_dtypes
        sd = {k: v.astype(ml_dtypes.bfloat16) for k, v in state_dict.items()}
        cfg, params = muddpythia_hf.from_state_dict(sd)
    else:
        cfg, params = muddpythia_hf.from_state_dict(state_dict, dtype=dtype)
    assert cfg.dtype == dtype and params["embed"].dtype == jnp.dtype(dtype)
    ids = jnp.asarray(ref["input_ids"])
    logits, coeffs = muddpythia.apply_jit(cfg, params, ids)
    logits2, coeffs2 = muddpythia.apply_jit(cfg, params, ids, coeffs=coeffs)
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(logits2), strict=True)
    for a, b in zip(coeffs["mix"], coeffs2["mix"]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), strict=True)
    if dtype == "bfloat16":   # sanity: bf16 compute stays close to the float32 reference
        assert _max_err(logits, ref["logits"]) < 0.1


@pytest.mark.parametrize("dtype", ["float32"])   # bfloat16: the integration tier
def test_replay_is_bitwise_equal_to_record_under_jit(state_dict, ref, dtype):
    check_replay_is_bitwise_equal_to_record_under_jit(state_dict, ref, dtype)


def _replay(model, ref, mix):
    cfg, params = model
    return np.asarray(muddpythia.apply_jit(cfg, params, jnp.asarray(ref["input_ids"]),
                                           coeffs={"mix": [jnp.asarray(a) for a in mix]})[0])


def test_reference_interventions_by_hand(model, ref, recorded):
    """The four replay interventions of the reference, written out with numpy."""
    mix = recorded[1]["mix"]
    perm = ref["interv/token_perm"]
    cases = {
        "exact": mix,
        "static_mean": [np.broadcast_to(a.mean(axis=(1, 2), keepdims=True), a.shape) for a in mix],
        "batch_swap": [a[:, ::-1] for a in mix],
        "token_shuffle": [a[:, :, perm] for a in mix],
    }
    for name, m in cases.items():
        assert _max_err(_replay(model, ref, m), ref[f"interv/logits_replay_{name}"]) < TOL, name
    # Replaying the reference's own cached coefficients also reproduces it.
    ref_mix = [ref[f"coef/total_{i}"] for i in range(N_LAYER)]
    assert _max_err(_replay(model, ref, ref_mix), ref["interv/logits_replay_exact"]) < TOL


def test_reference_interventions_with_generic_primitives(model, ref, recorded):
    """The same four interventions through dynjax.audit.interventions (schema-driven)."""
    from dynjax.audit.interventions import mean_over, permute

    schema = muddpythia.schema(model[0])
    coeffs = jax.tree.map(jnp.asarray, recorded[1])
    perm = jnp.asarray(ref["interv/token_perm"])
    cases = {
        "exact": coeffs,
        "static_mean": mean_over(coeffs, schema, ("example", "token")),
        "batch_swap": permute(coeffs, schema, "example", jnp.array([1, 0])),
        "token_shuffle": permute(coeffs, schema, "token", perm),
    }
    for name, c in cases.items():
        assert _max_err(_replay(model, ref, c["mix"]), ref[f"interv/logits_replay_{name}"]) < TOL, name


def test_bad_state_dicts_raise_value_error_naming_the_parameter(state_dict):
    missing = dict(state_dict)
    del missing["layers.2.attention_norms.1.bias"]
    with pytest.raises(ValueError, match=r"layers\.2\.attention_norms\.1\.bias"):
        muddpythia_hf.from_state_dict(missing)

    wrong = dict(state_dict)
    wrong["dense_bs.1"] = np.zeros((4, 4), np.float32)
    with pytest.raises(ValueError, match=r"dense_bs\.1"):
        muddpythia_hf.from_state_dict(wrong)

    extra = dict(state_dict)
    extra["layers.0.attention.wqkv.weight"] = np.zeros((192, 64), np.float32)
    with pytest.raises(ValueError, match=r"wqkv"):
        muddpythia_hf.from_state_dict(extra)

    with pytest.raises(ValueError, match=r"layers\.0\.feed_forward\.w1\.weight"):
        muddpythia_hf.from_state_dict(state_dict, config={**TINY_HF_CONFIG, "intermediate_size": 512})

    with pytest.raises(ValueError, match="stack_hidden"):
        muddpythia_hf.from_state_dict(state_dict, config={**TINY_HF_CONFIG, "stack_hidden": True})


def test_bad_coeffs_raise_value_error(model, ref):
    cfg, params = model
    ids = jnp.asarray(ref["input_ids"])
    bad = {"mix": [jnp.zeros((4, 2, 32, 2))] * N_LAYER}
    with pytest.raises(ValueError, match=r"coeffs\['mix'\]\[1\]"):
        muddpythia.apply(cfg, params, ids, coeffs=bad)


def test_state_dict_round_trip(model, state_dict):
    back = muddpythia_hf.to_state_dict(*model)
    assert set(back) == set(state_dict)
    for k, v in state_dict.items():
        np.testing.assert_array_equal(back[k], v, err_msg=k)


def test_load_hf_dir_reproduces_logits(tmp_path, state_dict, ref):
    from safetensors.numpy import save_file

    (tmp_path / "config.json").write_text(json.dumps(TINY_HF_CONFIG))
    names = sorted(state_dict)   # two shards, as large HF checkpoints are
    half = len(names) // 2
    save_file({k: state_dict[k] for k in names[:half]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({k: state_dict[k] for k in names[half:]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    cfg, params, tokenizer = muddpythia_hf.load_hf_dir(str(tmp_path))
    assert tokenizer is None and cfg.block_size == 64 and cfg.dtype == "float32"
    logits, _ = muddpythia.apply_jit(cfg, params, jnp.asarray(ref["input_ids"]))
    assert _max_err(logits, ref["logits"]) < TOL

    (tmp_path / "tokenizer.json").write_text("{}")
    try:
        import tokenizers  # noqa: F401
    except ImportError:   # without the package, the error says how to get it
        with pytest.raises(ImportError, match="pip install tokenizers"):
            muddpythia_hf.load_hf_dir(str(tmp_path))
