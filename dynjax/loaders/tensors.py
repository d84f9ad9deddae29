"""Reading a Hugging Face checkpoint's safetensors files: tensor by tensor, as they ship.

:class:`Tensors` parses each shard's header itself and reads one tensor at a time with
``preadv`` (no memory map: never the checkpoint twice in memory), casts it and puts it on
its devices (:func:`place`) before the next. It also dequantises block FP8 and MXFP4 by the
plain name, skips tensors a text forward does not use, rewrites wrapper prefixes
(:data:`PREFIXES`), and turns a damaged file into one :class:`CheckpointError`.
Depth: docs/hf.md#reading-the-tensors-dynjaxloaderstensorspy
"""
from __future__ import annotations

import glob
import json
import os
import re
import sys
from typing import Callable, Mapping

import ml_dtypes
import numpy as np

from dynjax.errors import CheckpointError, ConfigError

_DTYPES = {
    "BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32, "F64": np.float64,
    "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
    "F8_E8M0": ml_dtypes.float8_e8m0fnu, "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8,
    "U16": np.uint16, "I16": np.int16, "U32": np.uint32, "I32": np.int32, "U64": np.uint64,
    "I64": np.int64}
_MAX_HEADER = 100 << 20      # safetensors' own limit on the JSON header
_READ_AHEAD = 64 << 20      # bytes of a shard asked for ahead of the tensor being read
_REDOWNLOAD = "download that file again (or copy it again from the checkpoint's source)"

# checkpoint-name prefix rewrites by model_type: an architecture module whose checkpoints
# nest the text model (e.g. Qwen3.5's ``model.language_model.``) registers
# ``PREFIXES[model_type] = {"model.language_model.": "model."}``; the rest of its names
# (``lm_head.weight``) stay as they are.
PREFIXES: dict[str, Mapping[str, str]] = {}

# tensors of multimodal wrappers a text forward never reads, by name prefix
_TOWERS = ("visual.", "vision_tower.", "vision_model.", "vision_encoder.",
           "multi_modal_projector.", "mm_projector.", "audio_tower.", "audio_model.",
           "embed_vision.", "embed_audio.", "vision_embed.", "merger.")
_MTP_COUNT_FIELDS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers",
                     "num_mtp_modules")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def _stderr(line: str):
    print(line, file=sys.stderr)


# --------------------------------------------------------------------------------------------
# One safetensors file
# --------------------------------------------------------------------------------------------

class SafetensorsFile:
    """The header of one ``.safetensors`` file (checked against the file's size when opened)
    and its tensors read one at a time."""

    def __init__(self, path: str):
        self.path = path
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 2 or n > _MAX_HEADER:
                raise CheckpointError(f"{path} is not a safetensors file (no valid header; "
                                      f"{size} bytes); {_REDOWNLOAD}")
            if 8 + n > size:
                raise CheckpointError(f"{path} is cut short: its header alone needs {8 + n} "
                                      f"bytes and the file has {size}; {_REDOWNLOAD}")
            raw = f.read(n)
        try:
            header = json.loads(raw)
            if not isinstance(header, dict):
                raise ValueError("not an object")
        except (ValueError, UnicodeDecodeError):
            raise CheckpointError(f"{path} is not a safetensors file (its header is not a JSON "
                                  f"object); {_REDOWNLOAD}") from None
        header.pop("__metadata__", None)
        self.base = 8 + n
        self._ahead = 0          # where the bytes asked for ahead end
        self.entries: dict[str, tuple] = {}
        end = 0
        for name, e in header.items():
            try:
                dtype = np.dtype(_DTYPES[e["dtype"]])
                shape = tuple(int(d) for d in e["shape"])
                start, stop = (int(o) for o in e["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise CheckpointError(f"{path} has a damaged header entry for {name!r} "
                                      f"({str(e)[:80]}); {_REDOWNLOAD}") from None
            if stop - start != int(np.prod(shape)) * dtype.itemsize or start < 0:
                raise CheckpointError(f"{path} has a damaged header: tensor {name!r} "
                                      f"{e['dtype']}{list(shape)} spans bytes {start}..{stop}; "
                                      f"{_REDOWNLOAD}")
            self.entries[name] = (dtype, shape, start)
            end = max(end, stop)
        if self.base + end > size:
            raise CheckpointError(f"{path} is cut short: its header describes "
                                  f"{self.base + end} bytes and the file has {size}; "
                                  f"{_REDOWNLOAD}")

    def keys(self):
        return self.entries.keys()

    def dtype(self, name: str) -> np.dtype:
        return self.entries[name][0]

    def read(self, name: str, out: np.ndarray | None = None) -> np.ndarray:
        """The tensor ``name``: one allocation (or ``out``, a contiguous array of its dtype and
        size, e.g. a slot of a stacked param), filled by ``preadv`` (no mmap, no copy). The
        next 64 MB of the file are asked for ahead (``POSIX_FADV_WILLNEED``), so the disk reads
        the next tensors while this one is converted."""
        dtype, shape, start = self.entries[name]
        if out is None:
            buf = np.empty(int(np.prod(shape)) * dtype.itemsize, np.uint8)
        else:
            assert out.flags.c_contiguous and out.nbytes == np.prod(shape) * dtype.itemsize
            buf = out.reshape(-1).view(np.uint8)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            end = self.base + start + buf.size
            ahead = max(end, self._ahead)
            if end + _READ_AHEAD - ahead >= _READ_AHEAD // 2:   # one call per 32 MB at most
                os.posix_fadvise(fd, ahead, end + _READ_AHEAD - ahead, os.POSIX_FADV_WILLNEED)
                self._ahead = end + _READ_AHEAD
            done = 0
            while done < buf.size:
                got = os.preadv(fd, [memoryview(buf)[done:]], self.base + start + done)
                if got <= 0:
                    raise CheckpointError(f"{self.path} ended while reading {name!r} (the file "
                                          f"shrank after it was opened); {_REDOWNLOAD}")
                done += got
        finally:
            os.close(fd)
        return buf.view(dtype).reshape(shape) if out is None else out


def read_index(path: str) -> dict:
    """``model.safetensors.index.json``'s weight map (tensor name -> file name)."""
    fix = ("download it again, or delete it if the folder holds a single "
           "model.safetensors")
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
        weight_map = index["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str)
                                                       for v in weight_map.values()):
            raise TypeError
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is damaged (not valid JSON: {str(e)[:60]}); "
                              f"{fix}") from None
    except (KeyError, TypeError):
        raise CheckpointError(f"{path} has no weight_map of tensor name -> file; {fix}") from None
    return weight_map


# --------------------------------------------------------------------------------------------
# Dequantisation (formats as transformers' integrations finegrained_fp8 and mxfp4 read them)
# --------------------------------------------------------------------------------------------

FP4_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def unpack_e2m1(packed: np.ndarray) -> np.ndarray:
    """float32 of FP4 e2m1 values packed two per byte, the low nibble first: the last axis
    doubles (MXFP4's blocks and DeepSeek-V4's int8 experts share this packing)."""
    b = packed.view(np.uint8)
    out = np.empty(b.shape + (2,), np.float32)
    out[..., 0] = FP4_E2M1[b & 0x0F]
    out[..., 1] = FP4_E2M1[b >> 4]
    return out.reshape(b.shape[:-1] + (2 * b.shape[-1],))


def dequantize_fp8_block(weight: np.ndarray, scale_inv: np.ndarray, block) -> np.ndarray:
    """float32 of ``(..., N, K)`` FP8 weights times one scale per ``block`` = (bn, bk):
    ``scale_inv[..., i, j]`` scales rows ``[i*bn, (i+1)*bn)`` and columns ``[j*bk, (j+1)*bk)``,
    the last block of a dimension possibly short (DeepSeek-V3's 576-row
    ``kv_a_proj_with_mqa`` has 5 row blocks of 128). e8m0 scales are 2 ** (byte - 127)
    (stored as F8_E8M0 or as raw U8 bytes).

    An int8 weight is FP4-packed (DeepSeek-V4's experts, quantization_config
    ``expert_dtype="fp4"``): ``(..., N, K / 2)`` bytes of two e2m1 values each, low nibble
    first, with one scale per row and 32 columns, whatever ``block`` says (its scale grid
    ``(N, K / 32)`` gives the block, as transformers' Fp8Dequantize reads it)."""
    if weight.dtype == np.int8:
        w = unpack_e2m1(weight)
        (N, K), (sn, sk) = w.shape[-2:], scale_inv.shape[-2:]
        if N % sn or K % sk:
            raise CheckpointError(f"an FP4 weight of {N} x {K} values has a {sn} x {sk} scale "
                                  "grid that does not divide it; use the checkpoint's own files")
        block = (N // sn, K // sk)
    else:
        w = weight.astype(np.float32)
    if scale_inv.dtype == np.uint8:
        scale_inv = scale_inv.view(ml_dtypes.float8_e8m0fnu)
    s = scale_inv.astype(np.float32)
    (N, K), (sn, sk), (bn, bk) = w.shape[-2:], s.shape[-2:], block
    if (-(-N // bn), -(-K // bk)) != (sn, sk):
        raise CheckpointError(f"an FP8 weight of shape {w.shape} has a {s.shape} scale grid, "
                              f"not the ({-(-N // bn)}, {-(-K // bk)}) of weight_block_size="
                              f"{list(block)}; use the checkpoint's own config.json")
    s = np.repeat(np.repeat(s, bn, axis=-2)[..., :N, :], bk, axis=-1)[..., :K]
    w *= s
    return w


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray, dtype=np.float32) -> np.ndarray:
    """MXFP4 experts in the layout transformers' gpt-oss computes with, in ``dtype``: each
    expert dequantised in float32 and cast into its slot, so beside the result the host
    holds one float32 expert, not all of them.

    ``blocks`` is ``(E, R, G, 16)`` uint8 (two e2m1 values per byte, the low nibble first),
    ``scales`` ``(E, R, G)`` uint8 e8m0 exponents (2 ** (byte - 127)) shared by the 32 values
    of a group; row ``r`` holds ``G * 32`` values. The result is ``(E, G * 32, R)``: the
    checkpoint's rows become the last axis, as in transformers' ``gate_up_proj``
    ``(E, hidden, 2 * intermediate)`` and ``down_proj`` ``(E, intermediate, hidden)``."""
    b = blocks.view(np.uint8)
    if b.shape[:-1] != scales.shape:
        raise CheckpointError(f"MXFP4 blocks {b.shape} and scales {scales.shape} disagree")
    exponent = scales.view(np.uint8).astype(np.int32) - 127
    E, R, G = scales.shape
    out = np.empty((E, G * b.shape[-1] * 2, R), dtype)
    for e in range(E):
        out[e] = np.ldexp(unpack_e2m1(b[e]), exponent[e, ..., None]).astype(
            np.float32).reshape(R, -1).T
    return out


def check_quantization(hf: Mapping):
    """config.json's ``quantization_config``: block FP8 and MXFP4 load (dequantised);
    anything else is one line."""
    q = hf.get("quantization_config")
    if not q:
        return
    method = q.get("quant_method", "?") if isinstance(q, Mapping) else q
    if method == "fp8":
        block = q.get("weight_block_size")
        fmt = q.get("fmt", "e4m3")
        if not block or len(block) != 2 or fmt != "e4m3":
            raise ConfigError(f"config.json quantization_config (fp8, weight_block_size="
                              f"{block}, fmt={fmt!r}): dynjax dequantises block FP8 e4m3 "
                              "(weight_block_size=[n, k]); dequantize this checkpoint to bf16 "
                              "first")
        if q.get("activation_scheme", "dynamic") != "dynamic":
            raise ConfigError("config.json quantization_config activation_scheme="
                              f"{q['activation_scheme']!r}: only dynamic activation scaling "
                              "(weights dequantised, activations in the load dtype) is read")
        return
    if method == "mxfp4":
        return
    raise ConfigError(f"config.json quantization_config (quant_method={method!r}): dynjax "
                      "dequantises fp8 (block) and mxfp4 on load, nothing else; dequantize to "
                      "bf16 first (load with transformers and dequantize=True, then "
                      "save_pretrained) and drop quantization_config")


# --------------------------------------------------------------------------------------------
# The load dtype
# --------------------------------------------------------------------------------------------

def checkpoint_dtype(hf: Mapping) -> str | None:
    """config.json's ``dtype`` (transformers 5) or ``torch_dtype``, also in a wrapper's
    ``text_config``; None when absent."""
    for c in (hf, hf.get("text_config") or {}):
        v = c.get("dtype") or c.get("torch_dtype")
        if v:
            return str(v).removeprefix("torch.")
    return None


def default_dtype(hf: Mapping) -> tuple[str, str]:
    """(dtype, why): the checkpoint's own dtype where dynjax computes in it."""
    stored = checkpoint_dtype(hf)
    if stored in ("bfloat16", "float32"):
        return stored, f"config.json torch_dtype={stored}"
    if stored == "float16":
        return "float32", "config.json torch_dtype=float16, which float32 holds exactly"
    if hf.get("quantization_config"):
        return "bfloat16", "a quantized checkpoint with no torch_dtype, dequantised to bfloat16"
    return "float32", ("config.json names no torch_dtype" if stored is None else
                       f"config.json torch_dtype={stored} is not computed; float32")


def resolve_dtype(hf: Mapping, dtype=None) -> tuple[str, str]:
    """(dtype, why) for a requested dtype (None: the checkpoint's default)."""
    if dtype is None:
        return default_dtype(hf)
    name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
    if name not in ("float32", "bfloat16"):
        raise ConfigError(f"dtype={name}; load as float32 or bfloat16")
    return name, "asked for"


# --------------------------------------------------------------------------------------------
# The checkpoint's tensors
# --------------------------------------------------------------------------------------------

def _text(hf: Mapping) -> Mapping:
    """config.json's text model fields (a multimodal wrapper keeps them in text_config)."""
    return {**hf, **(hf.get("text_config") or {})}


def unused_by_text(name: str, hf: Mapping | None) -> str | None:
    """Why a text forward never reads tensor ``name`` (None: it may)."""
    bare = name.removeprefix("model.")
    if bare.startswith(_TOWERS):
        return "vision/audio tower"
    if bare.startswith("mtp.") or bare.startswith("mtp_"):
        return "multi-token prediction"
    m = _LAYER.match(name)
    text = _text(hf or {})
    if m and any(text.get(k) for k in _MTP_COUNT_FIELDS) and int(m.group(1)) >= int(
            text.get("num_hidden_layers", 1 << 30)):
        return "multi-token prediction"
    return None


class Tensors:
    """The checkpoint's tensors by name, read one at a time from the safetensors files
    (``model.safetensors.index.json``'s weight map when sharded).

    ``config``: the config.json dict (or its text part), which decides what is skipped as
    unused by a text forward (its multi-token-prediction layers) and the prefix rewrite of
    its ``model_type`` (:data:`PREFIXES`; ``prefixes`` overrides it). ``log``: where the one
    line about skipped tensors goes (stderr)."""

    def __init__(self, path: str, config: Mapping | None = None,
                 prefixes: Mapping[str, str] | None = None,
                 log: Callable[[str], None] | None = None):
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            weight_map = read_index(index)
            files = sorted(set(weight_map.values()))
            missing = [f for f in files if not os.path.exists(os.path.join(path, f))]
            if missing:
                raise CheckpointError(f"{index} lists {missing[0]}, which is not in {path}; "
                                      "copy every shard of the checkpoint")
        else:
            weight_map = None
            files = [os.path.basename(f) for f in
                     sorted(glob.glob(os.path.join(path, "*.safetensors")))]
            if not files:
                raise CheckpointError(f"no *.safetensors file in {path}; convert the "
                                      "checkpoint with transformers' save_pretrained")
        self._files = {f: SafetensorsFile(os.path.join(path, f)) for f in files}
        if weight_map is not None:
            for name, f in weight_map.items():
                if name not in self._files[f].entries:
                    raise CheckpointError(f"{index} places {name!r} in {f}, which does not hold "
                                          "it; the index and the shards come from different "
                                          "downloads: download the checkpoint again")
        if prefixes is None:
            prefixes = PREFIXES.get((config or {}).get("model_type"), {})
        self.source: dict[str, tuple[str, str]] = {}   # name -> (file, name in the file)
        self.skipped: dict[str, list] = {}
        for f, h in self._files.items():
            for raw in h.keys():
                why = unused_by_text(raw, None)
                name = _rewrite(raw, prefixes)
                why = why or unused_by_text(name, config)
                if why:
                    self.skipped.setdefault(why, []).append(raw)
                else:
                    self.source[name] = (f, raw)
        self.where = self._logical_names()
        q = (config or {}).get("quantization_config") or {}
        self.fp8_block = tuple(q.get("weight_block_size") or (128, 128))
        self.used: set = set()
        if self.skipped:
            (log or _stderr)(f"{path}: skipped {sum(map(len, self.skipped.values()))} tensors a "
                             "text forward does not use (" + "; ".join(
                                 f"{why}: {len(v)}, e.g. {v[0]}"
                                 for why, v in self.skipped.items()) + ")")

    def _logical_names(self) -> dict:
        """name -> file, with each quantized weight and its scales as one name."""
        where = {}
        for name, (f, raw) in self.source.items():
            if name.endswith("_scale_inv") and name.removesuffix("_scale_inv") in self.source:
                continue
            if name.endswith(".scale") and name[:-6] + ".weight" in self.source:
                continue                       # DeepSeek-V4's own name for weight_scale_inv
            if name.endswith(("_scales", "_blocks")):
                stem = name[:-7]
                if stem + "_blocks" in self.source and stem + "_scales" in self.source:
                    where[stem] = f
                    continue
            where[name] = f
        return where

    def __contains__(self, name):
        return name in self.where

    def _scale_of(self, name: str) -> str | None:
        """The scales beside quantized weight ``name``: ``weight_scale_inv`` (transformers'
        name) or ``scale`` (DeepSeek-V4-Flash's own); None if it has none."""
        names = [name + "_scale_inv"] + ([name[:-7] + ".scale"] if name.endswith(".weight")
                                         else [])
        return next((n for n in names if n in self.source), None)

    def _raw(self, name: str, out: np.ndarray | None = None) -> np.ndarray:
        f, raw = self.source[name]
        return self._files[f].read(raw, out)

    def _stored(self, name: str):
        """(dtype, shape) of ``name`` if it is read as stored (no dequantisation), else None."""
        if name not in self.source or self._scale_of(name):
            return None
        f, raw = self.source[name]
        dtype, shape, _ = self._files[f].entries[raw]
        return dtype, shape

    def stack(self, names, shape: tuple, dtype=None) -> np.ndarray:
        """The tensors ``names`` (each of shape ``shape``) as one ``(len(names), *shape)``
        array, e.g. a layer's experts: stored ones are read straight into their slot, so
        host memory holds the stacked param and nothing beside it; dequantised ones (FP8,
        MXFP4) or a mix of dtypes are read one at a time and cast into their slot of an
        array of ``dtype`` (the param's; None: the dtypes' common one), so beside the
        stacked param there is one float32 tensor, not a float32 stack."""
        kinds = {self._stored(n) for n in names}
        if len(kinds) == 1 and None not in kinds and _is_float(next(iter(kinds))[0]):
            out = np.empty((len(names), *shape), next(iter(kinds))[0])
            for slot, name in zip(out, names):
                self.get(name, shape, out=slot)
            return out
        if dtype is None:
            dtype = np.result_type(*(k[0] if k else np.float32 for k in kinds))
        out = np.empty((len(names), *shape), dtype)
        for slot, name in zip(out, names):
            slot[...] = self.get(name, shape)
        return out

    def get(self, name: str, shape: tuple | None = None, integer: bool = False,
            out: np.ndarray | None = None, dtype=None) -> np.ndarray:
        """The tensor ``name`` of shape ``shape`` (None: any): as stored, or float32 where
        dequantised (MXFP4 experts: ``dtype``, the param's, cast expert by expert).
        ``integer``: an index table (DeepSeek-V4's ``tid2eid``), read as the integers it
        holds; any other integer tensor is a quantized payload. ``out``: where a stored
        float tensor is read (:meth:`stack`'s slots)."""
        if name not in self.where:
            raise CheckpointError(f"checkpoint lacks tensor {name!r} (shape {shape}); the "
                                  "safetensors files are incomplete or config.json describes "
                                  "another model")
        if out is not None:
            stored = self._stored(name)
            if stored is None or stored[0] != out.dtype or stored[1] != out.shape:
                _wrong_shape(name, stored[1] if stored else None, out.shape)
            a = self._raw(name, out)
        elif name not in self.source:                     # MXFP4 *_blocks + *_scales
            a = dequantize_mxfp4(self._raw(name + "_blocks"), self._raw(name + "_scales"),
                                 np.float32 if dtype is None else dtype)
        elif self._scale_of(name):                     # block FP8 (or FP4) + its scales
            a = dequantize_fp8_block(self._raw(name), self._raw(self._scale_of(name)),
                                     self.fp8_block)
        else:
            a = self._raw(name)
            if integer and a.dtype.kind in "iu":
                pass
            elif not _is_float(a.dtype):
                raise CheckpointError(f"tensor {name!r} is {a.dtype} with no scales beside it "
                                      f"({name}_scale_inv or {name}_blocks/_scales); the "
                                      "checkpoint is quantized in a format dynjax does not "
                                      "read: dequantize it to bf16 first")
        if shape is not None and tuple(a.shape) != tuple(shape):
            _wrong_shape(name, a.shape, shape)
        self.used.add(name)
        return a


def _is_float(dtype: np.dtype) -> bool:
    """A float of 16 bits or more (bfloat16's numpy kind is 'V'): read as stored."""
    return (dtype.kind == "f" or dtype.name == "bfloat16") and dtype.itemsize >= 2


def _wrong_shape(name: str, got, implied):
    raise CheckpointError(f"tensor {name!r} has shape {tuple(got or ())} but config.json "
                          f"implies {tuple(implied)}; use the checkpoint's own config.json")


_IGNORED = ("rotary_emb.inv_freq",)  # buffers some exports carry; recomputed by the ports


def refuse_unused(t: Tensors, cfg) -> None:
    """One CheckpointError if the checkpoint holds tensors the port of ``cfg`` (its
    ``model_type``, ``tie_word_embeddings``) never read: config.json may describe another
    model."""
    extra = sorted(k for k in t.where if k not in t.used and not k.endswith(_IGNORED)
                   and not (cfg.tie_word_embeddings and k == "lm_head.weight"))
    if extra:
        raise CheckpointError(f"checkpoint has {len(extra)} tensor(s) this {cfg.model_type} "
                              f"port does not use, e.g. {extra[0]!r}; config.json may "
                              "describe another model (or pass strict=False)")


def _rewrite(name: str, prefixes: Mapping[str, str]) -> str:
    for old, new in prefixes.items():
        if name.startswith(old):
            return new + name[len(old):]
    return name


def place(a: np.ndarray, dtype, sharding=None):
    """``a`` as a jax array of ``dtype``, on ``sharding`` (each device receives its shard)
    or the default device; the host copy is dropped when this returns. ``a`` may be a
    transposed view: the device copy transposes it (faster than numpy's strided copy). A
    bfloat16 tensor loaded as float32 is widened on its devices, which is bitwise numpy's
    cast (every one of the 65,536 bfloat16 values checked) at half its CPU time and with no
    float32 copy on the host; other casts are numpy's."""
    import jax

    a = np.asarray(a)
    widen = a.dtype == ml_dtypes.bfloat16 and np.dtype(dtype) == np.float32
    if a.dtype != np.dtype(dtype) and not widen:
        a = a.astype(dtype)
    out = jax.device_put(a, sharding) if sharding is not None else jax.device_put(a)
    return out.astype(dtype) if widen else out
