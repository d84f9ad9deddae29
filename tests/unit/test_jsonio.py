"""dynjax.jsonio: the one atomic writer: whole files or none, arrays as JSON values."""
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from dynjax import jsonio


def test_json_converts_arrays_and_replaces_whole(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("old")
    jsonio.write_json_atomic(path, {"b": jnp.arange(3), "a": np.float32(0.5), "c": (np.int64(2),)})
    assert path.read_text() == json.dumps({"a": 0.5, "b": [0, 1, 2], "c": [2]}, indent=1,
                                          sort_keys=True)
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]   # no temp file left
    jsonio.write_json_atomic(path, {"b": 1, "a": 2}, indent=None, sort_keys=False)
    assert jsonio.read_json(path) == {"b": 1, "a": 2} and path.read_text() == '{"b": 1, "a": 2}'


def test_failed_write_keeps_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "r.json"
    jsonio.write_text_atomic(path, "old")

    def fail(f):
        f.write(b"half")
        raise RuntimeError("disk full")
    with pytest.raises(RuntimeError, match="disk full"):
        jsonio.atomic_write(path, fail)
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    with pytest.raises(ValueError):   # NaN refused where asked, old file kept
        jsonio.write_json_atomic(path, {"x": float("nan")}, allow_nan=False)
    assert path.read_text() == "old"


def test_command_line_of_a_main_run_in_process_is_its_argv(monkeypatch):
    """A test (or a sweep) that runs audit.py's main in-process sets sys.argv; the report names
    that command, not the test runner's ``python -m pytest``."""
    monkeypatch.setattr("sys.argv", ["audit.py", "--out=a b"])
    assert jsonio.command_line() == "python audit.py '--out=a b'"


def test_publish_json_prints_and_writes_only_with_out(tmp_path, capsys):
    jsonio.publish_json({"ratio": np.float64(1.5), "n": jnp.int32(3)}, None)
    assert json.loads(capsys.readouterr().out) == {"ratio": 1.5, "n": 3}
    assert list(tmp_path.iterdir()) == []
    jsonio.publish_json({"ratio": 2.0}, tmp_path / "r.json")
    assert json.loads(capsys.readouterr().out) == jsonio.read_json(tmp_path / "r.json") == {
        "ratio": 2.0}
