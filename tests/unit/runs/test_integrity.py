"""Per-array digests (dynjax/runs/integrity.py): NumPy's digest of an array in host memory is
the device program's, bit for bit, for every dtype a state holds; a known answer; and both
paths see a non-finite entry. Checkpoints saved on one backend verify on another only if so."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from dynjax.runs import integrity
from tests.conftest import normal

MIX = 2654435761


def tree():
    x = normal(0, (3, 5))
    return {"f32": jnp.asarray(x), "bf16": jnp.asarray(x, jnp.bfloat16),
            "f16": jnp.asarray(x, jnp.float16), "i32": jnp.arange(-7, 8, dtype=jnp.int32),
            "u8": jnp.arange(250, 256, dtype=jnp.uint8),
            "i8": jnp.asarray([-128, 0, 127], jnp.int8),
            "bool": jnp.asarray([True, False, True]), "key": jax.random.key(3),
            "raw_key": jax.random.PRNGKey(4), "scalar": jnp.float32(2.5),
            "np_f32": np.asarray(x), "np_bf16": x.astype(ml_dtypes.bfloat16),
            "empty": jnp.zeros((0, 4))}


def test_numpy_digest_is_the_device_programs_bit_for_bit():
    t = tree()
    assert all(integrity._in_host_memory(x) for x in jax.tree.leaves(t))
    device = jax.device_get(integrity._digests(t))
    for name, x in t.items():
        s1, s2, finite = integrity._host_digest(x)
        assert [s1, s2, int(finite)] == [int(v) for v in device[name]], name


def test_numpy_sums_in_chunks_as_the_device_sums_whole(monkeypatch):
    x = jnp.asarray(normal(1, (10, 7)))
    monkeypatch.setattr(integrity, "_CHUNK", 16)          # 70 words: four chunks and a rest
    s1, s2, _ = integrity._host_digest(x)
    assert [s1, s2] == [int(v) for v in jax.device_get(integrity._digests([x]))[0][:2]]


def test_known_answer_and_the_mixed_tree():
    w = np.arange(5, dtype=np.uint32) + 1000
    s1 = int(w.sum()) % 2**32
    s2 = sum(int(v) * ((MIX * i + 1) % 2**32) for i, v in enumerate(w)) % 2**32
    sums, bad = integrity.digest({"w": jnp.asarray(w)})
    assert sums == {"['w']": f"{s1:08x}{s2:08x}"} and bad == []
    # a leaf the host path leaves to the device (a Python scalar) beside host arrays: each
    # digest in its own place, none shifted to another path
    both, _ = integrity.digest({"a": jnp.asarray(w), "b": 7, "c": jnp.asarray(w[::-1])})
    assert both["['a']"] == sums["['w']"] and both["['b']"] != both["['c']"]
    assert both["['c']"][:8] == sums["['w']"][:8] and both["['c']"][8:] != sums["['w']"][8:]


def test_both_paths_see_a_non_finite_entry():
    x = np.ones((4,), np.float32)
    x[2] = np.nan
    bf = jnp.asarray([1.0, np.inf], jnp.bfloat16)
    _, bad = integrity.digest({"nan": jnp.asarray(x), "inf": bf, "ok": jnp.ones(3)})
    assert sorted(bad) == ["['inf']", "['nan']"]
    device = jax.device_get(integrity._digests({"nan": jnp.asarray(x), "inf": bf}))
    assert int(device["nan"][2]) == 0 and int(device["inf"][2]) == 0
