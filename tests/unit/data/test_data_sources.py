"""Fashion-MNIST from its Debian package, TFDS classification datasets, and audio features.
Training and auditing on a TFDS dataset: tests/integration/data/test_data_sources_training.py."""
import io

import numpy as np
import pytest

from dynjax.data import fetch, tabular, tfds_classify
from dynjax.data.text import DataError
from dynjax.train import classify
from configs import dgmlp_tfds, mlp_common


def _fashion_missing() -> str | None:
    """Why Fashion-MNIST is not here: the set-up's recorded reason (no apt, download failed)."""
    fname = tabular.DATASETS["fashion_mnist"]
    if (tabular.data_dir(None) / fname).exists() or tabular.FASHION_SYSTEM_DIR.is_dir():
        return None
    return fetch.skipped_reason(fname) or \
        "Fashion-MNIST not fetched: run `python -m dynjax.data.fetch`"


@pytest.mark.skipif(_fashion_missing() is not None, reason=str(_fashion_missing()))
def test_fashion_mnist_from_the_debian_package():
    s = tabular.load("fashion_mnist")
    assert {k: v[0].shape for k, v in s.items()} == {
        "train": (55000, 784), "validation": (5000, 784), "test": (10000, 784)}
    assert np.bincount(s["test"][1]).tolist() == [1000] * 10  # the official test set
    assert tabular.num_classes(s) == 10
    x = s["train"][0]
    assert x.dtype == np.float32 and x.min() == 0.0 and x.max() == 1.0


def test_idx_reader_and_its_errors():
    header = bytes([0, 0, 8, 2]) + np.array([2, 3], ">i4").tobytes()
    np.testing.assert_array_equal(tabular.read_idx(header + bytes(range(6))),
                                  np.arange(6, dtype=np.uint8).reshape(2, 3))
    with pytest.raises(ValueError, match="holds 5 values"):
        tabular.read_idx(header + bytes(5))
    with pytest.raises(ValueError, match="unsigned-byte IDX"):
        tabular.read_idx(b"\x00\x00\x0d\x01" + bytes(8))


def test_corrupt_debian_package_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(tabular, "FASHION_SYSTEM_DIR", tmp_path / "absent")
    (tmp_path / tabular.DATASETS["fashion_mnist"]).write_bytes(b"not an ar archive")
    with pytest.raises(DataError, match="not a Debian package.*tabular fetch"):
        tabular.load("fashion_mnist", str(tmp_path))


# ------------------------------------------------------------------ TFDS (built here, for real)

tfds = pytest.importorskip("tensorflow_datasets")


def _png(a):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


def _images(n, seed):
    return np.random.default_rng(seed).integers(0, 256, (n, 8, 8, 3), dtype=np.uint8)


class DynjaxTinyImages(tfds.core.GeneratorBasedBuilder):
    """CIFAR-10's layout (Image + ClassLabel; train and test), 8x8 pixels."""
    VERSION = tfds.core.Version("1.0.0")
    SPLIT_SIZES = {"train": 40, "test": 12}

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(8, 8, 3)),
            "label": tfds.features.ClassLabel(num_classes=4)}))

    def _split_generators(self, dl_manager):
        return {s: self._generate_examples(s) for s in self.SPLIT_SIZES}

    def _generate_examples(self, split):
        images = _images(self.SPLIT_SIZES[split], len(split))
        for i, a in enumerate(images):
            yield i, {"image": _png(a), "label": self._label(split, a)}

    def _label(self, split, image):
        return int(image[0, 0, 0]) % 4  # recoverable from the pixels, to check the pairing


class DynjaxTinyImagenetLike(DynjaxTinyImages):
    """Tiny-ImageNet's layout: labelled train and validation, unlabelled (-1) test."""
    SPLIT_SIZES = {"train": 40, "validation": 8, "test": 8}

    def _label(self, split, image):
        return -1 if split == "test" else int(image[0, 0, 0]) % 4


class DynjaxCustomKeys(DynjaxTinyImages):
    """A dataset whose input and label features have other names than image / label."""

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "pixels": tfds.features.Image(shape=(8, 8, 3)),
            "category": tfds.features.ClassLabel(num_classes=4)}))

    def _generate_examples(self, split):
        for i, ex in super()._generate_examples(split):
            yield i, {"pixels": ex["image"], "category": ex["label"]}


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfds")
    for builder in (DynjaxTinyImages, DynjaxTinyImagenetLike, DynjaxCustomKeys):
        builder(data_dir=str(root), file_format="array_record").download_and_prepare()
    return str(root)


def test_tfds_images_read_exactly(tfds_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("DYNJAX_DATA", str(tmp_path))
    s = tabular.load("tfds:dynjax_tiny_images", tfds_dir)
    rows = lambda x: sorted(map(bytes, np.round(x * 255).astype(np.uint8)))
    written = lambda n, split: _images(n, len(split)).reshape(n, -1)
    # TFDS stores examples in its own (shuffled) order; no validation split in the dataset, so
    # the last 10% of train (in that order) is one.
    assert (len(s["train"][0]), len(s["validation"][0])) == (36, 4)
    assert rows(np.concatenate([s["train"][0], s["validation"][0]])) == \
        sorted(map(bytes, written(40, "train")))
    assert rows(s["test"][0]) == sorted(map(bytes, written(12, "test")))
    for x, y in s.values():  # pixels exact (k/255 in float32) and each label with its image
        assert x.dtype == np.float32 and y.dtype == np.int32
        np.testing.assert_array_equal(x, np.round(x * 255) / np.float32(255))
        np.testing.assert_array_equal(y, np.round(x[:, 0] * 255).astype(int) % 4)
    cached = tabular.load("tfds:dynjax_tiny_images", tfds_dir)  # from the .npz cache
    for split in s:
        np.testing.assert_array_equal(cached[split][0], s[split][0])


def test_tfds_unlabelled_test_split_uses_validation(tfds_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("DYNJAX_DATA", str(tmp_path))
    s = tabular.load("tfds:dynjax_tiny_imagenet_like", tfds_dir)
    assert {k: len(v[1]) for k, v in s.items()} == {"train": 36, "validation": 4, "test": 8}
    assert (s["test"][1] >= 0).all()


def test_tfds_errors_name_the_fix(tfds_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("DYNJAX_DATA", str(tmp_path))
    with pytest.raises(DataError, match="tfds build cifar10 --data_dir"):
        tabular.load("tfds:cifar10", str(tmp_path / "empty"))
    with pytest.raises(DataError, match="could not be read.*tfds build no_such_dataset"):
        tabular.load("tfds:no_such_dataset", str(tmp_path / "empty"))
    with pytest.raises(DataError, match="needs data.data_dir"):
        tabular.load("tfds:cifar10", None)
    with pytest.raises(DataError, match="tfds_input_key"):
        tabular.load("tfds:dynjax_tiny_images", tfds_dir, tfds_input_key="pixels")
    with pytest.raises(DataError, match="tfds_label_key.*'category'"):
        tabular.load("tfds:dynjax_tiny_images", tfds_dir, tfds_label_key="category")
    c = dgmlp_tfds.get_config("dgate,cifar10")
    with pytest.raises(ValueError, match="needs data.data_dir"):
        classify.resolve_config(c)
    c.data.data_dir = tfds_dir
    assert classify.resolve_config(c).model.hidden == (1024, 1024)
    with pytest.raises(ValueError, match="METHOD,DATASET"):
        dgmlp_tfds.get_config("dgate")
    with pytest.raises(ValueError, match="tfds:NAME"):
        classify.resolve_config(mlp_common.base("dgate", "cifar10"))


def test_log_mel_puts_a_tone_in_the_right_band():
    sr = 16000
    t = np.arange(sr) / sr
    feats = tfds_classify.log_mel(np.sin(2 * np.pi * 1000 * t), sr)
    assert feats.shape == (98, 40) and feats.dtype == np.float32
    peak = int(np.argmax(feats.mean(0)))
    mel = lambda f: 2595 * np.log10(1 + f / 700)
    centres = 700 * (10 ** (np.linspace(0, mel(sr / 2), 42)[1:-1] / 2595) - 1)
    assert abs(centres[peak] - 1000) < (centres[peak + 1] - centres[peak])
    # Louder input, same shape of spectrum: log power shifts by 2*log(gain) everywhere it counts.
    louder = tfds_classify.log_mel(10 * np.sin(2 * np.pi * 1000 * t), sr)
    assert abs(louder[:, peak].mean() - feats[:, peak].mean() - 2 * np.log(10)) < 1e-3
    with pytest.raises(ValueError, match="shorter than one"):
        tfds_classify.log_mel(np.zeros(100), sr)


def test_audio_examples_become_fixed_size_features():
    sr = 16000
    short = {"audio": np.ones(8000, np.int16), "label": 3}
    long = {"audio": np.ones(20000, np.int16), "label": 1}
    x, y = tfds_classify.examples_to_arrays([short, long], "audio", "label", sr)
    assert x.shape == (2, 98 * 40) and y.tolist() == [3, 1]


class DynjaxTinyText(tfds.core.GeneratorBasedBuilder):
    """A text dataset in TFDS's layout (a Text feature named 'text'), for the LM data path."""
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
        return {s: self._generate_examples(s) for s in ("train", "validation", "test")}

    def _generate_examples(self, split):
        for i in range(5):
            yield i, {"text": f"{split} document {i} ü " * 10}


def test_tfds_text_source_for_language_models(tmp_path, monkeypatch):
    from dynjax.data import text

    monkeypatch.setenv("DYNJAX_DATA", str(tmp_path / "cache"))
    DynjaxTinyText(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
    splits = text.load_splits("tfds", None, "dynjax_tiny_text", str(tmp_path))
    for split, data in splits.items():
        assert data.dtype == np.uint8
        docs = bytes(data).decode("utf-8").split("\n")
        assert sorted(docs) == sorted(f"{split} document {i} ü " * 10 for i in range(5))
