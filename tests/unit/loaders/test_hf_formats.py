"""How Hugging Face checkpoints are read (``dynjax.loaders.tensors``): block-FP8 and MXFP4
dequantisation equal to transformers' own (tests/data/hf_quant/, made by
scripts/make_quant_fixtures.py), an FP8 checkpoint's logits, the checkpoint's torch_dtype as
the default, tensors a text forward does not use skipped by name, a wrapper's prefix
rewritten, and broken files as one line (each tensor in its device shard, and the programs'
one line: tests/integration/loaders/test_hf_formats_processes.py)."""
from __future__ import annotations

import json
import os
import pathlib
import shutil

import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from dynjax.errors import CheckpointError, ConfigError
from dynjax.loaders import hf, tensors
from tests.conftest import ROOT

DATA = pathlib.Path(ROOT) / "tests" / "data"
QUANT = DATA / "hf_quant"
FP8_DEEPSEEK = {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                        "activation_scheme": "dynamic",
                                        "weight_block_size": [128, 128]}}
_PARAMS: dict = {}


def params_of(arch):
    """The float32 params of a committed fixture, loaded once per module."""
    if arch not in _PARAMS:
        _PARAMS[arch] = hf.load(str(DATA / "hf" / arch))[1]
    return _PARAMS[arch]


def test_quant_fixtures_are_small():
    assert sum(f.stat().st_size for f in QUANT.rglob("*") if f.is_file()) <= 500_000


def test_block_fp8_equals_transformers_dequantisation():
    """128 x 128 blocks, e8m0 scales on a 1 x 3 grid, and float32 scales whose last row
    block is short (200 rows): bitwise what transformers computes."""
    ref = np.load(QUANT / "tensors_reference.npz")
    t = tensors.Tensors(str(QUANT), FP8_DEEPSEEK)
    np.testing.assert_array_equal(t.get("model.layers.0.self_attn.o_proj.weight", (128, 384)),
                                  ref["fp8_e8m0"])
    short = t.get("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", (200, 72))
    np.testing.assert_array_equal(short, ref["fp8_short_block"])
    assert np.abs(ref["fp8_e8m0"]).max() > 0.1   # not a comparison of zeros
    # the scales are folded into their weights: no name of their own to use or to miss
    assert not any(k.endswith("_scale_inv") for k in t.where)


def test_fp8_block_size_comes_from_the_config():
    """A grid that the config's weight_block_size does not produce is one line."""
    t = tensors.Tensors(str(QUANT), {"quantization_config": {
        "quant_method": "fp8", "weight_block_size": [64, 64]}})
    with pytest.raises(CheckpointError, match=r"weight_block_size=\[64, 64\]"):
        t.get("model.layers.0.self_attn.o_proj.weight", (128, 384))


def test_mxfp4_equals_transformers_dequantisation():
    """gpt-oss's experts: asked for by their plain name, in transformers' layout
    (E, in, out), float32 and bfloat16 bitwise equal to convert_moe_packed_tensors."""
    ref = np.load(QUANT / "tensors_reference.npz")
    t = tensors.Tensors(str(QUANT))
    for proj, shape in (("gate_up_proj", (2, 64, 64)), ("down_proj", (2, 32, 64))):
        got = t.get(f"model.layers.0.mlp.experts.{proj}", shape)
        np.testing.assert_array_equal(got, ref[f"mxfp4_{proj}_f32"])
        bf16 = np.asarray(tensors.place(got, ml_dtypes.bfloat16)).astype(np.float32)
        np.testing.assert_array_equal(bf16, ref[f"mxfp4_{proj}_bf16"])
    assert len(np.unique(ref["mxfp4_down_proj_f32"])) > 50


def test_fp4_packed_experts_low_nibble_first_one_scale_per_32():
    """DeepSeek-V4's FP4 experts (quantization_config expert_dtype="fp4"): int8 bytes of two
    e2m1 values, the low nibble first, one e8m0 scale per row and 32 values (F8_E8M0 or U8
    bytes), whatever weight_block_size says; the grid must divide the weight."""
    row = np.array([0x21, 0xF9] * 8 + [0x70, 0x0E] * 8, np.uint8).view(np.int8)  # 64 values
    w = np.stack([row, row])                                       # (2, 32) bytes: 2 x 64
    s = np.array([[128, 126], [127, 127]], np.uint8)               # 2, 1/2 | 1, 1
    got = tensors.dequantize_fp8_block(w, s, (128, 128))
    np.testing.assert_array_equal(got[0, :4], [1.0, 2.0, -1.0, -12.0])    # 0x21 -> 0.5, 1.0
    np.testing.assert_array_equal(got[0, 32:36], [0.0, 3.0, -2.0, 0.0])   # 0x70, 0x0E at 1/2
    np.testing.assert_array_equal(got[1, :4], [0.5, 1.0, -0.5, -6.0])
    np.testing.assert_array_equal(
        tensors.dequantize_fp8_block(w, s.view(ml_dtypes.float8_e8m0fnu), (128, 128)), got)
    with pytest.raises(CheckpointError, match="does not divide"):
        tensors.dequantize_fp8_block(w, s[:, :1].repeat(3, 1), (128, 128))


def test_fp8_checkpoint_loads_to_transformers_logits():
    """A Llama whose projections are block FP8 (layer 0 float32 scales, layer 1 e8m0) against
    transformers' forward of its own dequantised weights; bf16 by default (its dtype)."""
    ref = np.load(QUANT / "llama_fp8" / "reference.npz")
    model, params = hf.load(str(QUANT / "llama_fp8"), dtype="float32")
    logits, _ = jax.jit(model.apply)(params, ref["input_ids"])
    assert np.abs(np.asarray(logits) - ref["logits"]).max() <= 1e-5
    assert np.abs(ref["logits"]).max() > 1.0
    model16, params16 = hf.load(str(QUANT / "llama_fp8"))
    assert model16.cfg.dtype == "bfloat16"
    assert params16["layers"][1]["attn"]["q"].dtype == ml_dtypes.bfloat16
    chex.assert_trees_all_equal(
        params16, jax.tree.map(lambda a: a.astype(ml_dtypes.bfloat16), params))


@pytest.mark.parametrize("q, match", [
    ({"quant_method": "awq", "bits": 4}, "quant_method='awq'"),
    ({"quant_method": "fp8", "fmt": "e4m3"}, "weight_block_size=None"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128],
      "activation_scheme": "static"}, "activation_scheme='static'")])
def test_other_quantizations_are_one_line(q, match):
    cfg = json.load(open(DATA / "hf" / "llama" / "config.json"))
    with pytest.raises(ConfigError, match=match) as e:
        hf.config_from_hf({**cfg, "quantization_config": q})
    assert "\n" not in str(e.value)
    for ok in (FP8_DEEPSEEK["quantization_config"], {"quant_method": "mxfp4"}):
        hf.config_from_hf({**cfg, "quantization_config": ok})


def test_torch_dtype_is_the_default():
    assert tensors.resolve_dtype({"torch_dtype": "bfloat16"})[0] == "bfloat16"
    assert tensors.resolve_dtype({"dtype": "bfloat16"})[0] == "bfloat16"   # transformers 5
    assert tensors.resolve_dtype({"text_config": {"dtype": "bfloat16"}})[0] == "bfloat16"
    assert tensors.resolve_dtype({"torch_dtype": "float16"})[0] == "float32"
    assert tensors.resolve_dtype({})[0] == "float32"
    assert tensors.resolve_dtype({"torch_dtype": "bfloat16"}, "float32") == ("float32",
                                                                             "asked for")
    with pytest.raises(ConfigError, match="float16"):
        tensors.resolve_dtype({}, "float16")


def test_programs_say_which_dtype_they_load(tmp_path, capsys):
    """HfDir (sample.py, audit.py --hf, scorecard.py --hf) prints one line with the dtype."""
    from dynjax.audit.targets.hf import HfDir

    d = _copy(DATA / "hf" / "qwen3", tmp_path / "q")
    cfg = json.load(open(d / "config.json"))
    (d / "config.json").write_text(json.dumps({**cfg, "dtype": "bfloat16"}))
    assert HfDir(str(d)).cfg.dtype == "bfloat16"
    assert HfDir(str(d), config={"hf": {"dtype": "float32"}}).cfg.dtype == "float32"
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"{d}: weights load in bfloat16 (config.json torch_dtype=bfloat16)",
                     f"{d}: weights load in float32 (asked for)"]


# ---------------------------------------------------------------------------------------------
# Skipped by name, prefixes rewritten
# ---------------------------------------------------------------------------------------------

def _copy(src, dst) -> pathlib.Path:
    shutil.copytree(src, dst)
    return pathlib.Path(dst)


def _add_shard(d: pathlib.Path, arrays: dict, name="extra.safetensors"):
    from safetensors.numpy import save_file
    save_file(arrays, str(d / name))


def test_mtp_layers_and_towers_are_skipped_with_one_line(tmp_path, capsys):
    d = _copy(DATA / "hf" / "llama", tmp_path / "llama")
    cfg = json.load(open(d / "config.json"))
    n = cfg["num_hidden_layers"]
    z = np.zeros((4, 4), np.float32)
    _add_shard(d, {f"model.layers.{n}.mlp.gate_proj.weight": z, f"model.layers.{n}.eh_proj.weight": z,
                   "model.visual.blocks.0.attn.qkv.weight": z, "vision_tower.patch.weight": z,
                   "mtp.fc.weight": z})
    with pytest.raises(CheckpointError, match=f"model.layers.{n}"):   # not declared: extra
        hf.load(str(d))
    (d / "config.json").write_text(json.dumps({**cfg, "num_nextn_predict_layers": 1}))
    capsys.readouterr()
    _, params = hf.load(str(d))
    chex.assert_trees_all_equal(params, params_of("llama"))
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "skipped 5 tensors a text forward does not use" in err[0], err
    assert "multi-token prediction: 3" in err[0] and "vision/audio tower: 2" in err[0]


def test_which_names_a_text_forward_skips():
    v3 = {"num_hidden_layers": 61, "num_nextn_predict_layers": 1}
    wrapper = {"model_type": "qwen3_5_moe", "text_config": {"num_hidden_layers": 40,
                                                            "mtp_num_hidden_layers": 1}}
    skip = tensors.unused_by_text
    assert skip("model.layers.61.eh_proj.weight", v3) == "multi-token prediction"
    assert skip("model.layers.60.mlp.gate.weight", v3) is None
    assert skip("model.layers.61.eh_proj.weight", {"num_hidden_layers": 61}) is None
    assert skip("model.layers.40.self_attn.q_proj.weight", wrapper) == "multi-token prediction"
    assert skip("mtp.layers.0.mlp.gate.weight", wrapper) == "multi-token prediction"
    assert skip("model.visual.blocks.0.attn.qkv.weight", wrapper) == "vision/audio tower"
    assert skip("model.language_model.layers.0.mlp.gate.weight", wrapper) is None
    assert skip("lm_head.weight", wrapper) is None


def test_a_needed_tensor_that_is_missing_is_still_one_line(tmp_path):
    from safetensors.numpy import load_file, save_file

    d = _copy(DATA / "hf" / "llama", tmp_path / "llama")
    arrays = load_file(str(d / "model.safetensors"))
    del arrays["model.layers.1.self_attn.k_proj.weight"]
    save_file(arrays, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match="lacks tensor 'model.layers.1.self_attn.k_proj"):
        hf.load(str(d))


def test_a_wrappers_text_model_is_read_through_its_prefix(tmp_path, monkeypatch, capsys):
    """Qwen3.5-style names (model.language_model.*, model.visual.*) read by a text port that
    declares the rewrite in tensors.PREFIXES."""
    from safetensors.numpy import load_file, save_file

    d = _copy(DATA / "hf" / "llama", tmp_path / "llama")
    arrays = load_file(str(d / "model.safetensors"))
    arrays = {k.replace("model.", "model.language_model.", 1): v for k, v in arrays.items()}
    arrays["model.visual.merger.weight"] = np.ones((2, 2), np.float32)
    save_file(arrays, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match="model.embed_tokens"):
        hf.load(str(d))
    monkeypatch.setitem(tensors.PREFIXES, "llama", {"model.language_model.": "model."})
    chex.assert_trees_all_equal(hf.load(str(d))[1], params_of("llama"))


# ---------------------------------------------------------------------------------------------
# Placement
# ---------------------------------------------------------------------------------------------

def test_no_shard_stays_mapped_or_open():
    """Streaming: after the load no shard is memory-mapped (whose touched pages would count
    in host memory beside the params) or open."""
    d = str(DATA / "hf" / "mixtral")
    _, params = hf.load(d)
    jax.block_until_ready(params)
    maps = open("/proc/self/maps").read()
    fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
           if os.path.exists(f"/proc/self/fd/{fd}")]
    assert d not in maps and not any(d in f for f in fds)


def test_load_holds_the_params_and_one_tensor_not_the_checkpoint_twice(tmp_path):
    """Streaming, on the real path (hf.load of a 4-shard bf16 Qwen3-MoE checkpoint made by
    benchmarks/hf_load.py): the host buffers the loader allocates and frees peak at two
    params' worth (the stacked experts being read slot by slot, and the previous one, which
    jax lets go at the next transfer), not the checkpoint (14x that here). Stacking a list
    of per-expert reads, as before, peaked at 3.1x; holding every tensor read, at the
    checkpoint. Measured with tracemalloc, which counts every numpy buffer and none of XLA's
    device arrays, allocation by allocation: the same figure whatever else the process or
    the machine holds (an RSS figure is not: heap freed by earlier tests hides allocations),
    and no subprocess."""
    import tracemalloc

    from benchmarks import hf_load

    shape = {**hf_load.SHAPES["qwen3_moe"], "vocab_size": 1024, "hidden_size": 128,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
             "num_experts": 8, "moe_intermediate_size": 256}
    hf_load.make(str(tmp_path), 0.008, shape, shard_bytes=2 << 20)
    files = list(tmp_path.glob("*.safetensors"))
    tracemalloc.start()
    try:
        _, params = hf.load(str(tmp_path), dtype="bfloat16")
        jax.block_until_ready(params)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    leaves = jax.tree.leaves(params)
    largest = max(a.nbytes for a in leaves)           # 8 experts x 128 x 256 bf16: 512 KB
    checkpoint = sum(f.stat().st_size for f in files)
    assert len(files) >= 3 and checkpoint > 12 * largest and all(
        a.dtype == jnp.bfloat16 for a in leaves)
    assert peak - held <= 2.25 * largest, (peak - held, largest, checkpoint)


def _save(path: pathlib.Path, arrays: dict):
    """A safetensors file of numpy arrays, FP8 ones too (safetensors.numpy has no FP8)."""
    names = {np.dtype(v): k for k, v in tensors._DTYPES.items()}
    header, blobs, at = {}, [], 0
    for k, a in arrays.items():
        b = np.ascontiguousarray(a).tobytes()
        header[k] = {"dtype": names[a.dtype], "shape": list(a.shape),
                     "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"".join(blobs))


def test_fp8_experts_are_stacked_in_the_params_dtype_one_at_a_time(tmp_path):
    """Block-FP8 experts (DeepSeek-V3's format) are dequantised one at a time into their slot
    of a bfloat16 stack: bitwise the float32 stack cast to bfloat16, and beside the stack the
    host holds about one float32 expert's dequantisation (tracemalloc), not a float32 stack
    and a list of float32 experts (8x one expert here, 16 experts)."""
    import tracemalloc

    rng = np.random.default_rng(0)
    E, N, K = 16, 256, 256
    names = [f"model.layers.0.mlp.experts.{e}.down_proj.weight" for e in range(E)]
    arrays = {}
    for name in names:
        arrays[name] = rng.standard_normal((N, K)).astype(ml_dtypes.float8_e4m3fn)
        arrays[name + "_scale_inv"] = rng.uniform(0.5, 2.0, (2, 2)).astype(np.float32)
    _save(tmp_path / "model.safetensors", arrays)
    t = tensors.Tensors(str(tmp_path), FP8_DEEPSEEK)
    want = np.stack([t.get(n, (N, K)) for n in names]).astype(ml_dtypes.bfloat16)
    tracemalloc.start()
    try:
        got = t.stack(names, (N, K), ml_dtypes.bfloat16)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.dtype == ml_dtypes.bfloat16 and len({g.tobytes() for g in got}) == E
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    one = N * K * 4                                    # one expert in float32
    assert peak - held <= 3 * one, (peak - held, one)


def test_mxfp4_experts_are_cast_one_expert_at_a_time(tmp_path):
    """gpt-oss's MXFP4 stores a layer's experts as one tensor: dequantised into the param's
    bfloat16 expert by expert, bitwise the float32 result cast, with about one float32
    expert beside it (tracemalloc), not the layer's experts in float32 (16x one here)."""
    import tracemalloc

    rng = np.random.default_rng(0)
    E, R, G = 16, 256, 8
    name = "model.layers.0.mlp.experts.down_proj"
    _save(tmp_path / "model.safetensors", {
        name + "_blocks": rng.integers(0, 256, (E, R, G, 16), dtype=np.uint8),
        name + "_scales": rng.integers(120, 131, (E, R, G), dtype=np.uint8)})
    t = tensors.Tensors(str(tmp_path))
    want = t.get(name, (E, G * 32, R)).astype(ml_dtypes.bfloat16)
    tracemalloc.start()
    try:
        got = t.get(name, (E, G * 32, R), dtype=ml_dtypes.bfloat16)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.dtype == ml_dtypes.bfloat16 and np.abs(want.astype(np.float32)).max() > 1
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    one = G * 32 * R * 4                               # one expert in float32
    assert peak - held <= 6 * one, (peak - held, one)


def test_stacked_experts_are_the_stack_of_their_tensors():
    """Tensors.stack reads each expert into its slot: bitwise np.stack of the reads."""
    t = tensors.Tensors(str(DATA / "hf" / "qwen3_moe"))
    names = [f"model.layers.1.mlp.experts.{e}.down_proj.weight" for e in range(8)]
    got = t.stack(names, (48, 16))
    np.testing.assert_array_equal(got, np.stack([t.get(n, (48, 16)) for n in names]))
    assert len({got[e].tobytes() for e in range(8)}) == 8
    with pytest.raises(CheckpointError, match=r"has shape \(48, 16\) but config.json implies "
                       r"\(16, 48\)"):
        t.stack(names, (16, 48))


def test_bfloat16_widened_on_the_device_is_numpys_cast():
    """place widens bfloat16 to float32 after the device copy: every bfloat16 value (NaNs,
    infinities, subnormals) gives numpy's bits."""
    a = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16).reshape(256, 256)
    got = tensors.place(a.T, np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(got).view(np.uint32),
                                  a.T.astype(np.float32).view(np.uint32))


def test_place_casts_and_shards():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = tensors.place(a, ml_dtypes.bfloat16)
    assert got.dtype == ml_dtypes.bfloat16 and isinstance(got, jax.Array)
    np.testing.assert_array_equal(np.asarray(got, np.float32), a)


# ---------------------------------------------------------------------------------------------
# Broken files: one line naming the file and the fix
# ---------------------------------------------------------------------------------------------

def _truncate_shard(d):
    f = d / "model-00002-of-00003.safetensors"
    os.truncate(f, 100_000)
    return f


def _truncate_index(d):
    f = d / "model.safetensors.index.json"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    return f


def _foreign_shard(d):
    f = d / "model-00003-of-00003.safetensors"
    f.write_text("<html>404 Not Found</html>\n" * 20)
    return f


def _cut_header(d):
    f = d / "model-00001-of-00003.safetensors"
    os.truncate(f, 40)
    return f


def _index_lies(d):
    f = d / "model.safetensors.index.json"
    index = json.loads(f.read_text())
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = "model-00003-of-00003.safetensors" if (
        index["weight_map"][name] != "model-00003-of-00003.safetensors") else \
        "model-00001-of-00003.safetensors"
    f.write_text(json.dumps(index))
    return f


def _damaged_config(d):
    f = d / "config.json"
    f.write_bytes(f.read_bytes()[:40])
    return f


@pytest.mark.parametrize("damage, match", [
    (_truncate_shard, "is cut short: its header describes"),
    (_truncate_index, "is damaged \\(not valid JSON"),
    (_foreign_shard, "is not a safetensors file"),
    (_cut_header, "is cut short: its header alone needs"),
    (_index_lies, "which does not hold it"),
    (_damaged_config, "is damaged \\(not valid JSON")])
def test_broken_files_are_one_line_naming_the_file(tmp_path, damage, match):
    d = _copy(DATA / "hf" / "mixtral", tmp_path / "mixtral")
    f = damage(d)
    with pytest.raises(CheckpointError, match=match) as e:
        hf.load(str(d))
    assert str(f) in str(e.value) and "\n" not in str(e.value)
    assert "again" in str(e.value)
