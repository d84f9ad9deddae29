"""Hugging Face repo ids resolved offline from a cache folder laid out as the hub lays it
out (``models--ORG--NAME/refs``, ``snapshots/COMMIT/`` of symlinks into ``blobs/``), built
here from the committed tiny checkpoints under tests/data/hf/."""
import hashlib
import os
import pathlib
import shutil

import chex
import numpy as np
import pytest

from dynjax import decoding
from dynjax.errors import CheckpointError
from dynjax.loaders import hf, hub
from tests.conftest import ROOT

FIXTURES = pathlib.Path(ROOT, "tests", "data", "hf")
MAIN = "c" * 40          # refs/main: the llama fixture
OLD = "a" * 40           # an older commit (sorts first): the qwen3 fixture, also tag v1
FILES = ("config.json", "model.safetensors", "tokenizer.json")


def _fake_cache(root: pathlib.Path, repo="org/tiny-lm") -> pathlib.Path:
    """A hub cache holding ``repo`` at two commits; the newest snapshot folder on disk is
    OLD's, so only refs/main says which one main is."""
    folder = root / ("models--" + repo.replace("/", "--"))
    (folder / "blobs").mkdir(parents=True)
    (folder / "refs").mkdir()
    for commit, arch in ((MAIN, "llama"), (OLD, "qwen3")):
        snap = folder / "snapshots" / commit
        snap.mkdir(parents=True)
        for name in FILES:
            data = (FIXTURES / arch / name).read_bytes()
            blob = hashlib.sha256(data).hexdigest()
            (folder / "blobs" / blob).write_bytes(data)
            os.symlink(os.path.join("..", "..", "blobs", blob), snap / name)
    (folder / "refs" / "main").write_text(MAIN)
    (folder / "refs" / "v1").write_text(OLD)
    return root


def _both_readers():
    """The resolver with huggingface_hub's lookup (where installed) and with the layout
    reader alone: they must agree."""
    try:
        import huggingface_hub  # noqa: F401
        return [True, False]
    except ImportError:
        return [False]


@pytest.fixture(params=_both_readers(), ids=lambda v: "huggingface_hub" if v else "layout")
def cache(request, tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "USE_HUGGINGFACE_HUB", request.param)
    root = _fake_cache(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.chdir(tmp_path)      # no local folder named org/ shadows the repo id
    return root


def _model_type(path) -> str:
    return hf.read_config(path)["model_type"]


def test_repo_id_resolves_to_the_snapshot_refs_main_names(cache):
    path = hub.resolve("org/tiny-lm")
    assert pathlib.Path(path) == cache / "models--org--tiny-lm" / "snapshots" / MAIN
    assert _model_type(path) == "llama"


def test_revision_by_commit_by_tag_and_in_the_spec(cache):
    for spec, revision in (("org/tiny-lm", OLD), ("org/tiny-lm", "v1"),
                           (f"org/tiny-lm@{OLD}", None), ("org/tiny-lm@v1", None)):
        path = hub.resolve(spec, revision)
        assert pathlib.Path(path).name == OLD and _model_type(path) == "qwen3", (spec, revision)
    assert _model_type(hub.resolve("org/tiny-lm@main")) == "llama"


def test_the_cache_folder_follows_hf_home_and_xdg(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub.cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    _fake_cache(tmp_path / "xdg" / "huggingface" / "hub")
    monkeypatch.chdir(tmp_path)
    assert pathlib.Path(hub.resolve("org/tiny-lm")).name == MAIN


def test_absent_repo_or_revision_is_one_line_naming_where_it_looked(cache):
    for spec in ("org/nonesuch", "org/tiny-lm@v9"):
        with pytest.raises(CheckpointError) as e:
            hub.resolve(spec)
        msg = str(e.value)
        assert "\n" not in msg and str(cache) in msg and "hf download" in msg, msg


def test_local_paths_win_and_other_paths_pass_through(cache, tmp_path):
    (tmp_path / "org" / "tiny-lm").mkdir(parents=True)      # a local folder of that name
    assert hub.resolve("org/tiny-lm") == "org/tiny-lm"
    for spec in ("./x/y", "/no/such/dir", "a/b/c", "runs"):
        assert hub.resolve(spec) == spec
    assert hub.local_path("org/nonesuch") == "org/nonesuch"
    with pytest.raises(CheckpointError):
        hub.local_path("org/nonesuch", required=True)


def test_hf_load_and_tokenizer_take_a_repo_id(cache):
    model, params = hf.load("org/tiny-lm")
    _, direct = hf.load(str(FIXTURES / "llama"))
    chex.assert_trees_all_equal(params, direct)
    assert model.cfg.model_type == "llama"
    _, old = hf.load("org/tiny-lm", revision="v1")
    assert hf.read_config(hub.resolve("org/tiny-lm@v1"))["model_type"] == "qwen3"
    assert jax_leaves_differ(old, direct)
    ids = hf.tokenizer("org/tiny-lm").encode("The king").ids
    assert ids == hf.tokenizer(str(FIXTURES / "llama")).encode("The king").ids


def jax_leaves_differ(a, b) -> bool:
    import jax
    return len(jax.tree.leaves(a)) != len(jax.tree.leaves(b)) or any(
        x.shape != y.shape or not np.array_equal(x, y)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_open_target_takes_a_repo_id(cache):
    from dynjax.audit.targets import open_target

    target = open_target("org/tiny-lm@v1", kind="hf")
    assert target.path.name == OLD and target.cfg.model_type == "qwen3"
    with pytest.raises(CheckpointError, match="looked in"):
        open_target("org/nonesuch", kind="hf")


def test_loader_exports_no_modules():
    assert not {"os", "glob", "np", "json", "jnp"} & set(hf.__all__)
    assert all(hasattr(hf, name) for name in hf.__all__)


def test_decoding_a_target_instead_of_its_config_is_one_line():
    class Target:   # what runs.open_target returns: a model and params, not a config
        params = {}
    for call in (lambda: decoding.generate(Target(), {}, np.zeros((1, 2), np.int32), 2),
                 lambda: next(decoding.stream(Target(), {}, np.zeros((1, 2), np.int32), 2))):
        with pytest.raises(TypeError, match=r"not Target: pass \(target.model.cfg"):
            call()
