"""Shared tiny configs. Everything is float32 on CPU unless a test is about bfloat16."""
import importlib
import os
import sys
from typing import NamedTuple

import fsspec
import numpy as np
import pytest
from fsspec.implementations.memory import MemoryFileSystem

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # so tests can import tests.conftest (configs/ is installed too)


def normal(seed, shape, scale=1.0):
    """A float32 test input drawn by NumPy: ``jax.random`` compiles a program for every new
    shape (random draws were a fifth of the unit tier's compile time, mostly model inits)."""
    import jax.numpy as jnp
    return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape, np.float32))


def uniform(seed, shape, low=0.0, high=1.0):
    """A float32 test input, uniform in [low, high), drawn by NumPy (see :func:`normal`)."""
    import jax.numpy as jnp
    return jnp.asarray(np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32))


def perturbed(params, seed, scale):
    """``params`` with scale x N(0, 1) added to every leaf, in NumPy (see :func:`normal`), so
    that no controller sits at its (often constant) initial output."""
    import jax
    import jax.numpy as jnp
    leaves, tree = jax.tree.flatten(params)
    rng = np.random.default_rng(seed)
    return tree.unflatten([jnp.asarray(np.asarray(x, np.float32) + scale * rng.standard_normal(
        x.shape, np.float32), x.dtype) for x in leaves])


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


def assert_causal(apply, params, tokens, t=13):
    """Changing the bytes after position ``t`` never changes the logits at positions <= t,
    and does change some logit after it."""
    import numpy as np

    base = apply(params, tokens)[0]
    changed = tokens.at[:, t + 1:].set((tokens[:, t + 1:] + 7) % 256)
    other = apply(params, changed)[0]
    np.testing.assert_allclose(other[:, :t + 1], base[:, :t + 1], rtol=0, atol=1e-6)
    assert not np.allclose(other[:, t + 1:], base[:, t + 1:])


def assert_cache_decoding_equals_forward(cfg, params, ids, logits, prefill_len=9, atol=1e-5):
    """``dynjax.decoding`` gives the forward's ``logits`` at every position two ways: a
    ``prefill_len``-token prefill then one token a step, and every token a step from an
    empty cache. Prefill and step are separate jitted programs (one program holding both and
    generate has hung XLA:CPU for a hybrid model). Returns the cache after the second."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dynjax import decoding

    (B, T), P = ids.shape, prefill_len
    prefill = jax.jit(lambda p, t: decoding.prefill(cfg, p, t, T)[:2])
    step = jax.jit(lambda p, c, t, i: decoding.decode_step(cfg, p, c, t, i)[:2])
    out, cache = prefill(params, ids[:, :P])
    outs = [out]
    for i in range(P, T):
        out, cache = step(params, cache, ids[:, i], jnp.full((B,), i))
        outs.append(out[:, None])
    np.testing.assert_allclose(jnp.concatenate(outs, 1), logits, atol=atol, rtol=0)
    cache, outs = decoding.init_cache(cfg, B, T), []
    for i in range(T):
        out, cache = step(params, cache, ids[:, i], jnp.full((B,), i))
        outs.append(out)
    np.testing.assert_allclose(jnp.stack(outs, 1), logits, atol=atol, rtol=0)
    return cache


def assert_parity_figure_reproduces(arch, measured, ulps=32):
    """``measured`` (a max |dlogit| against transformers, computed here) is the figure
    results/hf_parity.json records for ``arch``, up to float32 noise; returns that row. The
    figure is bit for bit on the CPU that recorded it; on another one XLA's kernels sum in
    another order, our logits move by a few ulps of the largest logit, and so does a figure
    that is itself noise (deepseek_v4_fp4: 3.58e-6 recorded on an AMD EPYC, 6.62e-6 on an
    Intel Xeon, 13 ulps of 3.52). ``ulps`` of the row's ``max_abs_logit`` is the slack."""
    import json

    import numpy as np

    with open(os.path.join(ROOT, "results", "hf_parity.json")) as f:
        row = json.load(f)["architectures"][arch]
    slack = ulps * float(np.spacing(np.float32(row["max_abs_logit"])))
    recorded = row["max_abs_logit_diff"]
    assert abs(recorded - measured) <= slack, (
        f"results/hf_parity.json records max |dlogit| {recorded:.3g} for {arch}, this code "
        f"measures {measured:.3g} (more than {ulps} ulps of the largest logit apart): rerun "
        f"the row's checked_by command")
    return row


def cpu_devices_env(n_devices):
    """The environment for a subprocess with ``n_devices`` CPU devices: the count must be set
    before JAX starts. Any XLA flags the suite was started with are kept."""
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n_devices}"
    return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags.strip())


@pytest.fixture
def make_config():
    return tiny_config


class TinyModel(NamedTuple):
    model: object       # dynjax.models.build's Model
    params: dict        # fresh containers on each request: a test may edit its copy
    tokens: object      # (B, T) int32 bytes from key 0
    apply: object       # jax.jit(model.apply): one compilation per signature, shared


@pytest.fixture(scope="session")
def tiny_model():
    """``tiny_model(variant="feature_gate", shape=(4, 32), **model_overrides)``: one tiny
    language model per config for the whole session (``tiny_config``'s sizes, params from
    key 1), so files and tests that need the same model trace and compile its init and
    apply once instead of once each."""
    import jax

    from dynjax.models import build

    built = {}

    def get(variant="feature_gate", shape=(4, 32), **overrides):
        config = tiny_config(variant, **overrides).model.to_dict()
        key = (repr(sorted(config.items())), tuple(shape))   # overrides equal to a default
        if key not in built:                                  # share the default's model
            model = build(config)
            tokens = jax.random.randint(jax.random.key(0), shape, 0, 256)
            built[key] = TinyModel(model, model.init(jax.random.key(1), tokens), tokens,
                                   jax.jit(model.apply))
        t = built[key]
        return t._replace(params=jax.tree.map(lambda x: x, t.params))
    return get


@pytest.fixture(scope="session")
def faults_base(tmp_path_factory):
    """A finished 6-step tiny run (checkpoints 3 and 6) and its evaluation, trained once for
    the fault suites (tests/integration/train/test_faults*.py), which copy it before damaging it."""
    from dynjax.train import loop

    run = tmp_path_factory.mktemp("faults_base") / "run"
    return run, loop.train(tiny_config(), str(run), progress=False)


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


class CompileProfile:
    """Where the suite's time goes: XLA compilation per test (fixture set-up included) and per
    program, written as one JSON file per worker. Set DYNJAX_COMPILE_PROFILE=PREFIX; read the
    files with scripts/compile_profile.py. Subprocesses a test starts are not counted."""

    def __init__(self, prefix):
        import collections
        from jax import monitoring
        self.prefix, self.test = prefix, "(collection)"
        self.tests = collections.defaultdict(lambda: {"compile_s": 0.0, "compiles": 0,
                                                      "cache_hits": 0, "programs": {}})
        monitoring.register_event_duration_secs_listener(self._duration)

    def _duration(self, event, duration, **kw):
        t = self.tests[self.test]
        if event == "/jax/core/compile/backend_compile_duration":
            t["compile_s"] += duration
            t["compiles"] += 1
            name = kw.get("fun_name", "?")
            t["programs"][name] = t["programs"].get(name, 0.0) + duration
        elif event == "/jax/compilation_cache/cache_retrieval_time_sec":
            t["cache_hits"] += 1
        elif event in ("/jax/core/compile/jaxpr_trace_duration",
                       "/jax/core/compile/jaxpr_to_mlir_module_duration"):
            t["trace_lower_s"] = t.get("trace_lower_s", 0.0) + duration

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.test = item.nodeid
        yield
        self.test = "(between tests)"

    def pytest_sessionfinish(self, session):
        import json
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(f"{self.prefix}.{worker}.json", "w") as f:
            json.dump(self.tests, f)


def file_order(items) -> list:
    """``items`` with whole files longest first by tests/durations.json (a file it lacks
    counts as longest: it may be long), each file's tests in their own order: the two
    workers of scripts/test.sh take files in this order (``--no-loadscope-reorder``), so no
    long file starts last while the other worker idles."""
    import json
    try:
        with open(os.path.join(ROOT, "tests", "durations.json")) as f:
            seconds = json.load(f)["seconds"]
    except FileNotFoundError:
        return list(items)

    def key(item):
        name = os.path.relpath(str(item.path), ROOT).replace(os.sep, "/")
        return -seconds.get(name, float("inf")), name
    return sorted(items, key=key)     # stable: a file's tests keep their order


def pytest_collection_modifyitems(config, items):
    """Every test of the integration tier is ``slow``: ``-m "not slow"`` is the unit tier
    wherever its files are named. Files in :func:`file_order`."""
    integration = os.path.join(ROOT, "tests", "integration") + os.sep
    for item in items:
        if str(item.path).startswith(integration):
            item.add_marker(pytest.mark.slow)
    items[:] = file_order(items)


def pytest_configure(config):
    prefix = os.environ.get("DYNJAX_COMPILE_PROFILE")
    if prefix:
        config.pluginmanager.register(CompileProfile(prefix))
