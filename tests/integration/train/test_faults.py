"""The fault suite: each fault a run can meet, and what it must leave behind (docs/reliability.md).

Each case asserts the exit status (or the exception a program turns into one), the one line
on stderr, and the run directory's state afterwards. Runs are tiny and shared: one
finished run (``base``) is copied for the cases that damage a run, one longer run is the
reference for the preemption cases. Divergence is injected into the real train step (its
new parameters and loss set to NaN from a chosen step, what a diverged run produces), so
the real guard, loop and checkpointing are under test.
"""
import json
import os
import pathlib
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dynjax import errors
from dynjax.runs import integrity, rundir
from dynjax.jsonio import CorruptFile, read_jsonl
from dynjax.train import checkpoint, guard, lm, loop, preempt
from dynjax.train.runlock import RunLock
from tests.conftest import ROOT, tiny_config

TIMEOUT = 180


def _cli(args, timeout=TIMEOUT):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, JAX_PLATFORMS="cpu"))


def _one_line(stderr: str, prefix: str) -> str:
    """The single line starting with ``prefix``; no traceback anywhere."""
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


def _params(run, step=None):
    return rundir.load_params(run, step)[2]


def _saved(run):
    return [int(p.name) for p in sorted((pathlib.Path(run) / "checkpoints").iterdir(),
                                        key=lambda p: int(p.name))]


@pytest.fixture(scope="module")
def base(faults_base):
    """A finished 6-step run (checkpoints 3 and 6), copied by the cases that damage one."""
    return faults_base


def _copy(base, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(base[0], run)
    return run


# ------------------------------------------------------------------ non-finite guard

def _diverging(first: int, last: int = 10**9, loss_too: bool = True):
    """lm.Training whose real step's new parameters (and loss, with ``loss_too``) are NaN at
    steps ``first..last`` (1-based, the step counter after the update)."""
    class Diverging(lm.Training):
        def train_step(self, top_level=True):
            real = super().train_step(top_level)

            def step(state, tokens):
                new, metrics = real(state, tokens)
                bad = (new["step"] >= first) & (new["step"] <= last)
                new = {**new, "params": jax.tree.map(
                    lambda p: jnp.where(bad, jnp.nan, p), new["params"])}
                if loss_too:
                    metrics = {**metrics, "loss": jnp.where(bad, jnp.nan, metrics["loss"])}
                return new, metrics
            return step
    return Diverging


def _nan_config(**train):
    c = tiny_config()
    c.train.update(dict(steps=9, log_every=4, ckpt_every=3, keep_checkpoints=1, **train))
    return c


def test_divergence_stops_naming_the_step_and_the_newest_finite_checkpoint(tmp_path,
                                                                            monkeypatch):
    """NaN from step 5, between log boundaries (4, 8): read before the save at step 6."""
    monkeypatch.setattr(loop, "task_of", lambda config: _diverging(5))
    with pytest.raises(errors.NonFiniteError) as e:
        loop.train(_nan_config(), str(tmp_path), progress=False)
    assert "training diverged: step 5 has a non-finite loss or gradient" in str(e.value)
    assert "the newest checkpoint, step 3, is finite" in str(e.value)
    assert _saved(tmp_path) == [3]                        # keep-1 kept the finite one
    assert integrity.check(tmp_path / "checkpoints" / "3", {"params": _params(tmp_path)}) \
        is None
    assert not (tmp_path / "eval.json").exists()
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [4]


def test_a_non_finite_state_is_never_saved(tmp_path, monkeypatch):
    """Parameters NaN after step 6, whose loss and gradient were finite (the guard cannot
    see it): the save refuses it, so keep-1 does not delete step 3 to make room."""
    monkeypatch.setattr(loop, "task_of", lambda config: _diverging(6, 6, loss_too=False))
    with pytest.raises(errors.NonFiniteError, match=r"the state after step 6 has non-finite "
                       r"values in \['params'\].*the newest checkpoint, step 3, is finite"):
        loop.train(_nan_config(), str(tmp_path), progress=False)
    assert _saved(tmp_path) == [3]


def test_skip_nonfinite_skips_and_counts(tmp_path, monkeypatch):
    """Steps 3-4 diverge: each update is skipped (parameters and optimizer state kept: the
    optimizer's count lags the step by the skipped steps, and nothing non-finite is saved),
    and the log counts them. (Skipping every step since the last save stops the run:
    tests/integration/train/test_faults_edges.py.)"""
    monkeypatch.setattr(loop, "task_of", lambda config: _diverging(3, 4))
    c = tiny_config()
    c.train.skip_nonfinite = True
    result = loop.train(c, str(tmp_path), progress=False)
    assert result["step"] == 6 and np.isfinite(result["test"]["nll"])
    mngr = checkpoint.manager(tmp_path, 3, 2)
    task = lm.Training(tiny_config())
    target = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          task.abstract, task.state_shardings)
    counts = {step: {int(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(
        checkpoint.restore(mngr, target, step)["opt_state"]) if "count" in str(path)}
        for step in (3, 6)}
    assert counts == {3: {2}, 6: {4}}                   # steps 3 and 4 made no update
    logged = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "split" not in r]
    assert [(r["step"], r["skipped_nonfinite"]) for r in logged] == [(2, 0), (4, 2), (6, 2)]


def test_a_non_finite_checkpoint_from_before_the_guard_is_set_aside(base, tmp_path, capsys):
    """A run written before the guard holds a NaN step 6 (its digests match: only the
    finite check can tell): resume moves it aside and retrains from step 3 (bitwise the
    finished run); the audit's loader names it."""
    run = _copy(base, tmp_path)
    (run / "eval.json").unlink()
    mngr = checkpoint.manager(run, 3, 2)
    task = lm.Training(tiny_config())
    target = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          task.abstract, task.state_shardings)
    state = checkpoint.restore(mngr, target, 6)
    state["params"] = jax.tree.map(lambda p: p * jnp.nan, state["params"])
    mngr.delete(6)
    mngr.save(6, args=checkpoint.ocp.args.StandardSave(state), force=True,  # the old save
              custom_metadata=integrity.metadata(integrity.digest(state)[0]))   # (digests)
    with pytest.raises(errors.CheckpointError, match=r"checkpoint step 6 of run .* cannot be "
                       r"restored \(non-finite values in \['params'\]"):
        rundir.load_params(run)
    loop.train(tiny_config(), str(run), progress=False)
    err = capsys.readouterr().err
    assert f"warning: checkpoint step 6 of {run} cannot be restored (non-finite values in " \
        "['params']" in err and "resumed from step 3" in err
    assert (run / "unrestorable_checkpoints" / "6").is_dir()
    chex.assert_trees_all_equal(_params(run), _params(base[0]))


def test_loss_spike_warning():
    """One line when a logged loss reaches spike_factor x the running median; 0 is off."""
    losses = [5.0, 4.0, 3.5, 3.0, 2.9, 9.0, 2.8]        # median of the first five: 3.5
    for factor, expected in [(3.0, 0), (2.5, 1), (0.0, 0)]:
        lines = []
        watch = guard.SpikeWatch(factor, lines.append)
        for step, loss in enumerate(losses, 1):
            watch.see(step, loss)
        assert len(lines) == expected, (factor, lines)
    assert lines == [] and watch.recent[-1] == 2.8
    lines = []
    watch = guard.SpikeWatch(2.5, lines.append)
    for step, loss in enumerate(losses, 1):
        watch.see(step, loss)
    assert lines == ["warning: loss spike at step 6: 9 is 2.6x the median 3.5 of the last 5 "
                     "logged steps (train.spike_factor=2.5); lower train.lr or raise "
                     "train.warmup_steps if it does not come back down"]


# ------------------------------------------------------------------ checkpoint integrity

def test_a_flipped_bit_is_caught_set_aside_and_retrained(base, tmp_path, capsys):
    """One bit flipped in every array file of step 6 (orbax reads them without complaint):
    the digests differ, the audit's loader names it, resume moves it aside and retrains
    from step 3, bitwise the uninterrupted run. The same resume meets a torn last line of
    metrics.jsonl (a kill during an append): dropped with a warning."""
    run = _copy(base, tmp_path)
    (run / "eval.json").unlink()
    # the array data files (orbax rejects a flip in its small index files itself)
    for f in (run / "checkpoints" / "6" / "default" / "ocdbt.process_0" / "d").iterdir():
        if f.stat().st_size < 16384:
            continue
        data = bytearray(f.read_bytes())
        for i in range(len(data) // 8, len(data), len(data) // 8):
            data[i] ^= 0x10
        f.write_bytes(bytes(data))
    with pytest.raises(errors.CheckpointError, match=r"cannot be restored \(checksum mismatch "
                       r"in \[[^]]*'params'"):
        rundir.load_params(run)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 8, "loss": 2.7')                        # torn: no newline
    loop.train(tiny_config(), str(run), progress=False)
    err = capsys.readouterr().err
    # resume sets it aside (its reason: the digests, or TensorStore itself when a flip lands
    # in a block it decodes: the file layout varies with the order of orbax's writes)
    assert f"warning: checkpoint step 6 of {run} cannot be restored (" in err \
        and "resumed from step 3" in err
    assert f"warning: dropped the torn last line of {run / 'metrics.jsonl'}" in err
    assert (run / "unrestorable_checkpoints" / "6").is_dir()
    chex.assert_trees_all_equal(_params(run), _params(base[0]))
    untimed = lambda path: [{k: v for k, v in r.items() if k != "tokens_per_s"}  # noqa: E731
                            for r in read_jsonl(path)]
    assert untimed(run / "metrics.jsonl") == untimed(base[0] / "metrics.jsonl")


# ------------------------------------------------------------------ the run record

def test_a_finished_run_rerun_is_a_no_op_and_a_stale_lock_is_taken_over(base, tmp_path,
                                                                        capsys):
    run = _copy(base, tmp_path)
    (run / ".lock").write_text("pid 999999999 on a host that died\n")   # holder long gone
    before = {p.name: p.read_bytes() for p in (run / "metrics.jsonl", run / "eval.json",
                                               run / "config.json")}
    result = loop.train(tiny_config(), str(run), progress=False)
    assert f"{run} is finished (step 6 of 6, eval.json written): nothing to do" in \
        capsys.readouterr().out
    assert result == json.loads(before["eval.json"])
    assert {n: (run / n).read_bytes() for n in before} == before   # no duplicated records


def test_a_second_writer_is_refused_naming_the_holder(base, tmp_path):
    run = _copy(base, tmp_path)
    (run / "eval.json").unlink()
    with RunLock(run):
        with pytest.raises(errors.RunLocked, match=rf"{run} is being trained by another "
                           rf"process \(pid {os.getpid()} on "):
            loop.train(tiny_config(), str(run), progress=False)
    assert not (run / "eval.json").exists() and _saved(run) == [3, 6]


def test_a_gs_run_directory_is_locked_by_a_heartbeat_lease(memory_gcs):
    """On an object store (no flock) the lock is a lease: a live holder refuses a second
    writer in one line, its heartbeat keeps it live, a lapsed lease is taken over, and the
    lock goes with the holder that leaves."""
    from etils import epath

    from dynjax.train import runlock
    lock = epath.Path(memory_gcs) / ".lock"
    with RunLock(memory_gcs, lease=0.8):
        first = json.loads(lock.read_text())
        assert first["holder"] == f"pid {os.getpid()} on {socket.gethostname()}"
        with pytest.raises(errors.RunLocked, match=rf"{memory_gcs} is being trained by another "
                           rf"process \(pid {os.getpid()} on .*its lease ends \d+ s from now"):
            with RunLock(memory_gcs, lease=0.8):
                pass
        time.sleep(1.2)                                   # past one lease: the beat renewed it
        assert json.loads(lock.read_text())["heartbeat"] > first["heartbeat"]
        with pytest.raises(errors.RunLocked):
            with RunLock(memory_gcs, lease=0.8):
                pass
    assert not lock.exists()                              # released with its holder
    lock.write_text(json.dumps({"holder": "pid 1 on a host that died", "token": "dead",
                                "heartbeat": time.time() - 10}))
    with RunLock(memory_gcs, lease=0.8):                  # a lapsed lease is taken over
        assert json.loads(lock.read_text())["token"] != "dead"
    assert runlock.is_local("/tmp/run") and not runlock.is_local(memory_gcs)


@pytest.mark.parametrize("name, fix", [
    ("config.json", "config.json records how the run was made: restore it from a copy"),
    ("eval.json", "delete it and re-run the run's train.py command"),
])
def test_a_corrupt_run_file_is_named_with_its_fix(base, tmp_path, name, fix):
    run = _copy(base, tmp_path)
    (run / name).write_text('{"step": 6, "test": {"nll"')
    with pytest.raises(CorruptFile, match=rf"{run / name} is corrupt \(.* at line 1 column "
                       rf"\d+\): {fix}"):
        loop.train(tiny_config(), str(run), progress=False)


def test_a_corrupt_data_cache_manifest_is_named_with_its_fix(tmp_path):
    from dynjax.data import text

    cache = tmp_path / f"embedded_{text.CACHE_VERSION}"
    cache.mkdir()
    (cache / "manifest.json").write_text('{"train": {"sha256": "ab')   # a write cut short
    with pytest.raises(CorruptFile, match=rf"{cache / 'manifest.json'} is corrupt .*: delete "
                       rf"the folder {cache}: the next run rebuilds it"):
        text.load_splits("embedded", data_dir_=str(tmp_path))


@pytest.mark.parametrize("field, value, message", [
    ("b2", 2.0, "train.b2=2.0 must be in [0, 1)"),
    ("b1", -0.1, "train.b1=-0.1 must be in [0, 1)"),
    ("eps", 0.0, "train.eps=0.0 must be positive"),
    ("clip_norm", -1.0, "train.clip_norm=-1.0 must be >= 0"),
    ("warmup_steps", 7, "train.warmup_steps=7 must be in [0, train.steps=6]"),
    ("keep_checkpoints", 0, "train.keep_checkpoints=0 must be positive"),
])
def test_optimizer_nonsense_is_refused(tmp_path, field, value, message):
    c = tiny_config()
    c.train[field] = value
    with pytest.raises(errors.ConfigError, match=re.escape(message)):
        loop.train(c, str(tmp_path / "run"), progress=False)
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ filesystem errors

@pytest.mark.subprocess
def test_an_unwritable_workdir_is_refused_before_any_compute(tmp_path, monkeypatch):
    """--workdir under a file (ENOTDIR), and on a read-only mount (EROFS) where the machine
    lets a test mount one: refused before the data is read."""
    monkeypatch.setattr(lm.Training, "load_data", lambda self: pytest.fail("data read"))
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError) as e:
        loop.train(tiny_config(), str(tmp_path / "file" / "run"), progress=False)
    assert errors.describe_os_error(e.value).startswith(
        f"cannot write {tmp_path}/file/run: Not a directory (--workdir; {tmp_path}/file is a "
        "file) (errno 20, ENOTDIR)")
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "--bind", "-o", "ro", ro, ro], capture_output=True).returncode:
        pytest.skip("cannot mount a read-only folder here (the ENOTDIR case ran)")
    try:
        with pytest.raises(OSError) as e:
            loop.train(tiny_config(), str(ro / "run"), progress=False)
        assert "Read-only file system (--workdir) (errno 30, EROFS); the filesystem is " \
            "read-only" in errors.describe_os_error(e.value)
    finally:
        subprocess.run(["umount", ro], check=True)


@pytest.mark.subprocess
def test_a_full_disk_is_one_line_and_loses_nothing(tmp_path):
    """train.py on a 300 KB tmpfs: the first checkpoint does not fit. One line (no orbax
    thread tracebacks), exit status 2; no step directory is left looking complete."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", disk],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        out = _cli(["train.py", f"--workdir={disk}/run", *TINY_FLAGS, "--config.train.steps=4"])
        assert out.returncode == 2, out.stderr[-3000:]
        line = _one_line(out.stderr, "train.py: error: ")
        assert line.startswith(f"train.py: error: cannot write {disk}/run/checkpoints: No space "
                               "left on device (saving checkpoint step ") and \
            "(errno 28, ENOSPC)" in line and line.endswith(
            "then re-run the same command (no checkpoint was saved yet: it starts the run "
            "from the beginning)")
        # nothing but the run's header line (a log's first line) and the error
        assert [line for line in out.stderr.strip().splitlines() if not line.startswith(
            "feature_gate (")] == [line], out.stderr[-3000:]
        assert rundir.steps(disk / "run") == []          # only orbax's *-tmp folder
        assert (disk / "run" / "config.json").exists()
    finally:
        subprocess.run(["umount", disk], check=True)


TINY = dict(model=dict(d_model=32, n_heads=2, d_ff=64, n_layers=2), data=dict(seq_len=32),
            train=dict(batch_size=4, warmup_steps=1, log_every=10, ckpt_every=1000),
            eval=dict(windows=8, batch_size=8))
TINY_FLAGS = ["--config=configs/tiny.py:feature_gate", "--noprogress",
              *[f"--config.{s}.{k}={v}" for s, d in TINY.items() for k, v in d.items()]]


@pytest.mark.subprocess
def test_audit_and_plan_check_their_output_before_any_compute(base, tmp_path):
    (tmp_path / "file").write_text("")
    out = _cli(["audit.py", f"--out={tmp_path}/file/audit", f"--checkpoints={base[0]}"])
    assert out.returncode == 2
    assert _one_line(out.stderr, "audit.py: error: ").startswith(
        f"audit.py: error: cannot write {tmp_path}/file/audit: Not a directory (--out;")
    out = _cli(["audit.py", f"--out={tmp_path}/audit", f"--checkpoints={base[0]}",
                "--config.data.eval_windows=0"])
    assert out.returncode == 2
    assert "data.eval_windows=0 and data.calib_windows=64: the audit needs at least 2 " \
        "evaluation windows" in _one_line(out.stderr, "audit.py: error: ")
    assert not (tmp_path / "audit").exists()
    plan = ["-m", "dynjax.programs.plan", "--config=configs/tiny.py:feature_gate"]
    out = _cli([*plan, f"--out={tmp_path}/file/plan.json"])
    assert out.returncode == 2 and "(errno 20, ENOTDIR)" in _one_line(
        out.stderr, "dynjax.programs.plan: error: cannot write ")
    out = _cli([*plan, f"--out={tmp_path}/new/folder/plan.json"])   # a missing folder
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((tmp_path / "new/folder/plan.json").read_text())["preset"] == "dp"


@pytest.mark.subprocess
def test_fetch_parses_its_arguments(tmp_path):
    out = _cli(["-m", "dynjax.data.fetch", "--help"], timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("usage: python -m dynjax.data.fetch")
    assert not (ROOT_PATH / "--help").exists()
    out = _cli(["-m", "dynjax.data.fetch", "--bogus"], timeout=60)
    assert out.returncode == 2 and "unrecognized arguments: --bogus" in out.stderr


ROOT_PATH = pathlib.Path(ROOT)


# ------------------------------------------------------------------ preemption

PREEMPT_STEPS = 300
# hard limits only (no test waits for a duration): generous, since a loaded machine may
# take minutes to start a train.py (import, data, compile)
PREEMPT_TIMEOUT = 600
RESPONSE_TIMEOUT = 60   # for what the watcher thread answers the moment a signal arrives


def _signalling(at_log: int, sig=signal.SIGTERM):
    """lm.Training that raises ``sig`` in itself inside its ``at_log``-th logged step's log
    record: after the loop decided whether the step saves, where a signal lands when it
    arrives while the loop waits for the log sync or appends to metrics.jsonl."""
    class Signalling(lm.Training):
        logs = 0

        def log_record(self, *args):
            Signalling.logs += 1
            if Signalling.logs == at_log:
                signal.raise_signal(sig)   # the handler runs before this returns
            return super().log_record(*args)
    return Signalling


def test_a_signal_after_the_save_was_decided_stops_at_the_next_step_saved(base, tmp_path,
                                                                          monkeypatch):
    """The race behind 'saved checkpoint S' with S missing: the signal lands during step
    4's log record, after step 4 decided not to save. The run must not stop at 4 (unsaved):
    it trains step 5, saves it and stops there; resume is bitwise the uninterrupted run."""
    monkeypatch.setattr(loop, "task_of", lambda config: _signalling(2))    # logs: 2, 4, 6
    with pytest.raises(preempt.Preempted) as e:
        loop.train(tiny_config(), str(tmp_path), progress=False)
    assert (e.value.signum, e.value.step) == (signal.SIGTERM, 5)
    assert str(e.value).startswith("stopped by SIGTERM at step 5: saved checkpoint 5 in ")
    assert _saved(tmp_path) == [3, 5] and not (tmp_path / "eval.json").exists()
    monkeypatch.undo()
    loop.train(tiny_config(), str(tmp_path), progress=False)               # resume
    chex.assert_trees_all_equal(_params(tmp_path), _params(base[0]))
    untimed = lambda path: [{k: v for k, v in r.items() if k != "tokens_per_s"}  # noqa: E731
                            for r in read_jsonl(path)]
    assert untimed(tmp_path / "metrics.jsonl") == untimed(base[0] / "metrics.jsonl")


def _preempt_config():
    from configs import tiny

    c = tiny.get_config("feature_gate")
    for section, fields in TINY.items():
        c[section].update(fields)
    c.train.steps = PREEMPT_STEPS
    return c


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    loop.train(_preempt_config(), str(run), progress=False)
    return run


@pytest.fixture
def popen():
    """Starts subprocesses; any still running when the test ends (a failed one) is killed."""
    procs = []

    def start(args, **kw):
        procs.append(subprocess.Popen([sys.executable, *args], cwd=ROOT, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env=dict(os.environ, JAX_PLATFORMS="cpu"), **kw))
        return procs[-1]
    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _start_train(popen, run):
    return popen(["train.py", f"--workdir={run}", *TINY_FLAGS,
                  f"--config.train.steps={PREEMPT_STEPS}"])


def _wait_for_training(proc, run):
    """Until the run has logged a step (it is in the loop, compiled)."""
    deadline = time.monotonic() + PREEMPT_TIMEOUT
    while not (run / "metrics.jsonl").exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run never started"
        time.sleep(0.05)


@pytest.mark.subprocess
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_at_the_next_step_and_resumes_bitwise(uninterrupted, tmp_path, popen,
                                                             sig):
    run = tmp_path / "run"
    proc = _start_train(popen, run)
    _wait_for_training(proc, run)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=PREEMPT_TIMEOUT)
    assert proc.returncode == 128 + sig, err[-3000:]
    name = signal.Signals(sig).name
    assert _one_line(err, f"train.py: {name} received: saving a checkpoint at the end")
    line = _one_line(err, "train.py: stopped by ")
    step = int(line.split(" at step ")[1].split(":")[0])
    assert 10 <= step < PREEMPT_STEPS     # metrics.jsonl appears at step 10 (log_every)
    assert line == (f"train.py: stopped by {name} at step {step}: saved checkpoint {step} in "
                    f"{run}/checkpoints; re-run the same command to resume from it")
    assert rundir.steps(run)[-1] == step and not (run / "eval.json").exists()
    loop.train(_preempt_config(), str(run), progress=False)          # resume
    chex.assert_trees_all_equal(_params(run), _params(uninterrupted))
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == \
        [r["step"] for r in read_jsonl(uninterrupted / "metrics.jsonl")]


@pytest.mark.subprocess
def test_a_second_signal_exits_at_once(tmp_path, popen):
    """Both signals reach a stopped (SIGSTOP) run, so it cannot save between them however
    slow the machine; the run's threads may take them in either order: the one said
    'received' is the first, the other must exit at once with its own status."""
    run = tmp_path / "run"
    proc = _start_train(popen, run)
    lines = _Lines(proc)
    _wait_for_training(proc, run)
    proc.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + RESPONSE_TIMEOUT   # SIGCONT would cancel a pending stop
    while pathlib.Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] \
            != "T":
        assert time.monotonic() < deadline, "the run did not stop on SIGSTOP"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGCONT)
    err = lines.stderr(RESPONSE_TIMEOUT)
    received = re.search(r"^train\.py: (SIGINT|SIGTERM) received: ", err, re.M)
    assert received, err[-3000:]
    first = received.group(1)
    second = {"SIGINT": signal.SIGTERM, "SIGTERM": signal.SIGINT}[first]
    assert _one_line(err, f"train.py: {first} received: saving a checkpoint")
    assert proc.returncode == 128 + second, err[-3000:]
    assert _one_line(err, f"train.py: {second.name} again: exiting at once without saving")
    assert "train.py: stopped by" not in err
    # nothing saved for the signal (it came after step 10 was logged); orbax's own first save
    # (step 1) may be there
    assert [s for s in rundir.steps(run) if s >= 10] == [] and not (run / "eval.json").exists()


BLOCKED = """
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import io_callback
from dynjax.train import preempt

def ready():
    print("computing", flush=True)
    return np.float32(0)

@jax.jit
def forever(x):   # never returns: x stops growing at 2**24 in float32, below inf
    x = x + io_callback(ready, jax.ShapeDtypeStruct((), jnp.float32))
    return jax.lax.while_loop(lambda c: c < jnp.inf, lambda c: c + 1, x)

with preempt.StopOnSignal():
    forever(jnp.float32(0)).block_until_ready()
"""


class _Lines:
    """A subprocess's stdout and stderr lines, read by threads, so every wait has a hard
    timeout even when the process prints nothing."""

    def __init__(self, proc):
        self.proc, self.queue, self.seen = proc, queue.Queue(), {"stdout": [], "stderr": []}
        self.threads = [threading.Thread(target=self._read, args=(name,), daemon=True)
                        for name in self.seen]
        for t in self.threads:
            t.start()

    def _read(self, name):
        for line in getattr(self.proc, name):
            self.queue.put((name, line))
        self.queue.put((name, None))

    def wait_for(self, name: str, prefix: str, timeout=PREEMPT_TIMEOUT):
        deadline = time.monotonic() + timeout
        while True:
            try:
                stream, line = self.queue.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                pytest.fail(f"no {name} line starting with {prefix!r} in {timeout} s")
            if line is not None:
                self.seen[stream].append(line)
            if stream == name and (line is None or line.startswith(prefix)):
                assert line is not None, "".join(self.seen["stderr"])[-3000:]
                return

    def stderr(self, timeout=PREEMPT_TIMEOUT) -> str:
        """All of stderr, once the process has exited (within ``timeout``)."""
        self.proc.wait(timeout=timeout)
        for t in self.threads:
            t.join(timeout=PREEMPT_TIMEOUT)
        while not self.queue.empty():
            stream, line = self.queue.get()
            if line is not None:
                self.seen[stream].append(line)
        return "".join(self.seen["stderr"])


@pytest.mark.subprocess
def test_a_second_signal_exits_at_once_while_the_main_thread_computes(popen):
    """Python runs a signal handler only when the main thread runs Python again; here it
    waits for a device computation that never ends (what a long step, a compilation or a
    checkpoint write look like). Both signals (the second sent once the first was
    answered: two pending SIGTERMs are one) are still answered, and the process exits with
    the second one's status, or the hard timeout fails the test."""
    proc = popen(["-c", BLOCKED])
    lines = _Lines(proc)
    lines.wait_for("stdout", "computing")
    proc.send_signal(signal.SIGTERM)
    lines.wait_for("stderr", "train.py: SIGTERM received: ", RESPONSE_TIMEOUT)
    proc.send_signal(signal.SIGTERM)
    err = lines.stderr(RESPONSE_TIMEOUT)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert _one_line(err, "train.py: SIGTERM received: saving a checkpoint")
    assert _one_line(err, "train.py: SIGTERM again: exiting at once without saving")
