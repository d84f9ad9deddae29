"""Classification data from a TFDS dataset a user has prepared: CIFAR-10, Tiny-ImageNet,
Speech Commands, or any TFDS dataset with an image or audio input and a class label.

    --config.data.dataset=tfds:cifar10 --config.data.data_dir=/data/tensorflow_datasets

Never downloads: read with ``tfds.data_source(..., download=False)`` from array_record
files. Inputs become flat float32 vectors (images in [0, 1], audio as a standardised
log-mel spectrogram); splits, their fallbacks and the cache: docs/data.md.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

from dynjax.data.split_cache import SPLITS, cached_splits
from dynjax.data.text import data_dir
from dynjax.errors import DataError

PREFIX = "tfds:"
VALIDATION_FRACTION = 0.1
AUDIO_SECONDS = 1.0
CACHE_VERSION = "v1"


def log_mel(audio: np.ndarray, sample_rate: int, n_mels: int = 40, frame_ms: float = 25.0,
            hop_ms: float = 10.0) -> np.ndarray:
    """Log-mel spectrogram (frames, n_mels) of one mono clip: Hann-windowed frames, power
    spectrum, triangular filters evenly spaced on the HTK mel scale up to Nyquist."""
    audio = np.asarray(audio, np.float64)
    frame, hop = int(sample_rate * frame_ms / 1000), int(sample_rate * hop_ms / 1000)
    if len(audio) < frame:
        raise ValueError(f"clip of {len(audio)} samples is shorter than one {frame}-sample frame")
    n_fft = 1 << (frame - 1).bit_length()
    starts = np.arange(0, len(audio) - frame + 1, hop)
    frames = audio[starts[:, None] + np.arange(frame)] * np.hanning(frame)
    power = np.abs(np.fft.rfft(frames, n_fft)) ** 2                   # (frames, n_fft/2+1)
    mel = lambda f: 2595.0 * np.log10(1.0 + f / 700.0)
    hz = lambda m: 700.0 * (10.0 ** (m / 2595.0) - 1.0)
    edges = hz(np.linspace(0.0, mel(sample_rate / 2), n_mels + 2))  # filter edges in Hz
    bins = np.fft.rfftfreq(n_fft, 1.0 / sample_rate)
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    filters = np.clip(np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)), 0, None)
    return np.log(power @ filters.T + 1e-6).astype(np.float32)


def _audio_features(audio, sample_rate: int) -> np.ndarray:
    n = int(AUDIO_SECONDS * sample_rate)
    clip = np.zeros(n, np.float32)
    audio = np.asarray(audio, np.float32).reshape(-1)[:n]
    clip[:len(audio)] = audio
    return log_mel(clip, sample_rate).reshape(-1)


def examples_to_arrays(examples, input_key: str, label_key: str, sample_rate=None):
    """(x float32 (N, D), y int32 (N,)) from TFDS example dicts: an image (H, W, C) uint8
    input is scaled to [0, 1]; a 1-D input with ``sample_rate`` is audio (log-mel)."""
    xs, ys = [], []
    for ex in examples:
        if input_key not in ex or label_key not in ex:
            raise DataError(f"TFDS example has keys {sorted(ex)}; set data.tfds_input_key / "
                            f"data.tfds_label_key (now {input_key!r} / {label_key!r})")
        value = np.asarray(ex[input_key])
        if sample_rate is not None:
            xs.append(_audio_features(value, sample_rate))
        else:
            scale = 255.0 if value.dtype == np.uint8 else 1.0
            xs.append(value.astype(np.float32).reshape(-1) / scale)
        ys.append(int(ex[label_key]))
    if not xs:
        raise DataError("the TFDS split has no examples")
    return np.stack(xs), np.asarray(ys, np.int32)


def _sources(name: str, data_dir_: str | None):
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise DataError(f"data.dataset='{PREFIX}{name}' needs tensorflow_datasets: "
                        "`pip install tensorflow-datasets`") from e
    fix = f"build it there first: `tfds build {name} --data_dir=DIR --file_format=array_record`"
    try:
        builder = tfds.builder(name, data_dir=data_dir_)
        available = set(builder.info.splits)
        if not available:  # a known builder whose data is not under data_dir
            raise DataError(f"TFDS dataset {name!r} is not prepared under data.data_dir="
                            f"{data_dir_!r}; {fix}")
        sources = {s: tfds.data_source(name, split=s, data_dir=data_dir_, download=False)
                   for s in SPLITS if s in available}
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - TFDS raises many types for a missing dataset
        reason = str(e).strip().splitlines()[0]  # TFDS appends its whole catalogue
        raise DataError(f"TFDS dataset {name!r} could not be read from data.data_dir="
                        f"{data_dir_!r} ({type(e).__name__}: {reason}); {fix}") from e
    if "train" not in sources:
        raise DataError(f"TFDS dataset {name!r} has no 'train' split (splits: {sorted(available)})")
    return builder, sources


def _label_is_known(src, label_key) -> bool:
    """Tiny-ImageNet style test splits carry label -1 (unlabelled)."""
    return len(src) > 0 and int(src[0][label_key]) >= 0


def load(name: str, data_dir_: str | None, input_key: str | None = None,
         label_key: str = "label", cache_root=None) -> dict:
    """``{split: (x, y)}`` for the TFDS dataset ``name`` (see the module docstring)."""
    if not data_dir_:
        raise DataError(f"data.dataset='{PREFIX}{name}' needs data.data_dir: the directory "
                        "where the TFDS dataset was built")
    key = hashlib.sha1(f"{name}|{os.path.abspath(data_dir_)}|{input_key}|{label_key}".encode())
    cache = data_dir(cache_root) / (f"tfds_{name.replace('/', '_')}_{key.hexdigest()[:10]}_"
                                    f"{CACHE_VERSION}.npz")
    return cached_splits(cache, lambda: _read_splits(name, data_dir_, input_key, label_key))


def _read_splits(name: str, data_dir_: str, input_key: str | None, label_key: str) -> dict:
    """Decode every example of the dataset's splits (see the module docstring)."""
    builder, sources = _sources(name, data_dir_)
    features = builder.info.features
    input_key = input_key or ("image" if "image" in features else
                              "audio" if "audio" in features else None)
    if input_key is None or input_key not in features or label_key not in features:
        raise DataError(f"TFDS dataset {name!r} has features {sorted(features)}; name the input "
                        f"and the label with data.tfds_input_key / data.tfds_label_key (now "
                        f"{input_key!r} / {label_key!r})")
    sample_rate = getattr(features[input_key], "sample_rate", None)
    if "test" in sources and not _label_is_known(sources["test"], label_key):
        del sources["test"]
    if "test" not in sources:
        if "validation" not in sources:
            raise DataError(f"TFDS dataset {name!r} has no labelled test or validation split")
        sources["test"] = sources.pop("validation")
    read = lambda src: examples_to_arrays((src[i] for i in range(len(src))), input_key,
                                          label_key, sample_rate)
    splits = {s: read(src) for s, src in sources.items()}
    if "validation" not in splits:
        x, y = splits["train"]
        n_val = max(1, int(round(VALIDATION_FRACTION * len(x))))
        splits["train"], splits["validation"] = (x[:-n_val], y[:-n_val]), (x[-n_val:], y[-n_val:])
    if sample_rate is not None:  # standardise log-mel features with the training statistics
        mean, std = splits["train"][0].mean(0), splits["train"][0].std(0) + 1e-6
        splits = {s: ((x - mean) / std, y) for s, (x, y) in splits.items()}
    return splits
