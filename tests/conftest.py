"""Shared tiny configs. Everything is float32 on CPU unless a test is about bfloat16."""
import importlib
import os
import sys

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # so tests can import tests.conftest (configs/ is installed too)


def tiny_config(variant="feature_gate", **model_overrides):
    """A config small enough that a train step compiles and runs in well under a second."""
    from configs import common

    c = common.base(variant)
    c.model.update(dict(d_model=32, n_heads=2, n_layers=3, d_ff=64, scan_layers=True))
    if variant.startswith("fixed_depth") and not c.model.fixed_depth:
        c.model.fixed_depth = 2
    c.model.update(model_overrides)
    c.data.seq_len = 32
    c.train.update(dict(steps=6, batch_size=8, warmup_steps=2, log_every=2, eval_every=1000,
                        ckpt_every=3, lr=3e-3))
    c.eval.update(dict(windows=16, batch_size=8))
    return c


def cpu_devices_env(n_devices):
    """The environment for a subprocess with ``n_devices`` CPU devices: the count must be set
    before JAX starts. Any XLA flags the suite was started with are kept."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n_devices}"
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags.strip())


@pytest.fixture
def make_config():
    return tiny_config


class MemoryGCS(MemoryFileSystem):
    """fsspec's in-memory filesystem under the gs:// protocol, naming paths as gcsfs does
    (``bucket/key``, the protocol stripped)."""
    protocol = ("gs", "gcs")
    root_marker = ""

    @classmethod
    def _strip_protocol(cls, path):
        for p in ("gs://", "gcs://"):
            path = path[len(p):] if path.startswith(p) else path
        return path.rstrip("/")


@pytest.fixture
def memory_gcs():
    """gs:// through epath's fsspec backend, an in-memory filesystem in place of Google
    Cloud Storage (gcsfs and a bucket are not reachable offline)."""
    from etils.epath import backend
    registry = importlib.import_module("fsspec.registry")._registry
    saved = {k: registry.get(k) for k in ("gs", "gcs")}
    for k in saved:
        fsspec.register_implementation(k, MemoryGCS, clobber=True)
    backend.fsspec_backend._get_filesystem.cache_clear()
    MemoryFileSystem.store.clear()
    yield "gs://bucket/run"
    MemoryFileSystem.store.clear()
    for k, cls in saved.items():
        registry.pop(k, None)
        if cls is not None:
            fsspec.register_implementation(k, cls, clobber=True)
    backend.fsspec_backend._get_filesystem.cache_clear()
