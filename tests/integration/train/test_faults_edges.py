"""The fault suite's edges (issue 51): checkpoints without readable digests, divergence the
guard used to let through, the change record, racing first runs, the last tracebacks and
misleading lines, signals at start-up and during the final evaluation.

Like tests/integration/train/test_faults.py: each case asserts the exception a program turns into its one
line (or the process's exit status and stderr, where the promise is about a process), and
the run directory afterwards. The finished tiny run (``faults_base``, tests/conftest.py) is
shared with tests/integration/train/test_faults.py and copied by the cases that damage one.
"""
import importlib.util
import json
import math
import os
import pathlib
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
import optax
import pytest

from dynjax import errors
from dynjax.jsonio import CorruptFile
from dynjax.runs import integrity, rundir
from dynjax.train import checkpoint, guard, lm, loop, optim, preempt
from tests.conftest import ROOT, cpu_devices_env, tiny_config
from tests.integration.train.test_faults import TIMEOUT, TINY_FLAGS, _diverging, _one_line, _params


def _copy(base, tmp_path, unfinished=True):
    run = tmp_path / "run"
    shutil.copytree(base[0], run)
    if unfinished:
        (run / "eval.json").unlink()
    return run


def _flip_bits(step_dir):
    """One bit flipped in each large array file (orbax reads them without complaint)."""
    for f in (step_dir / "default" / "ocdbt.process_0" / "d").iterdir():
        if f.stat().st_size >= 16384:
            data = bytearray(f.read_bytes())
            for i in range(len(data) // 8, len(data), len(data) // 8):
                data[i] ^= 0x10
            f.write_bytes(bytes(data))


def _drop_digests(step_dir):
    """The checkpoint as a save cut off before its digests were recorded leaves it."""
    meta = step_dir / integrity.METADATA
    record = json.loads(meta.read_text())
    del record["custom_metadata"][integrity.KEY]
    meta.write_text(json.dumps(record))


# ------------------------------------------------------------------ digests (1)

def test_the_digests_are_committed_inside_the_checkpoint(faults_base):
    """In orbax's step metadata, which orbax writes before it renames the step into place:
    no kill can leave a committed checkpoint without its digests."""
    for step in (3, 6):
        step_dir = faults_base[0] / "checkpoints" / str(step)
        meta = json.loads((step_dir / integrity.METADATA).read_text())
        assert meta["custom_metadata"][integrity.KEY]["arrays"] == integrity.recorded(step_dir)
        assert len(integrity.recorded(step_dir)) > 3
        assert not (step_dir / integrity.FILE).exists()


def test_a_checkpoint_without_readable_digests_is_never_trusted_silently(faults_base, tmp_path,
                                                                         capfd):
    """Step 6 lost its digests: the audit's loader says it is unverified. Then it loses a
    bit too; a damaged metadata file reads as no digests; resume prefers verified step 3,
    moves 6 aside naming why, and retrains bitwise the uninterrupted run."""
    run = _copy(faults_base, tmp_path)
    six = run / "checkpoints" / "6"
    _drop_digests(six)
    capfd.readouterr()
    rundir.load_params(run, 6)
    assert f"warning: checkpoint step 6 of run {run} has no readable digests: restored " \
        "unverified" in capfd.readouterr().err
    _flip_bits(six)
    meta = run / "checkpoints" / "3" / integrity.METADATA
    kept = meta.read_bytes()
    meta.write_bytes(kept[:len(kept) // 2])                    # a damaged digest record
    assert integrity.recorded(meta.parent) is None
    meta.write_bytes(kept)
    loop.train(tiny_config(), str(run), progress=False)
    err = capfd.readouterr().err
    assert f"warning: checkpoint step 6 of {run} cannot be restored (it has no readable " \
        "digests" in err and "resumed from step 3" in err
    assert (run / "unrestorable_checkpoints" / "6").is_dir()
    chex.assert_trees_all_equal(_params(run), _params(faults_base[0]))


# ------------------------------------------------------------------ divergence (2)

def _skip_config(**train):
    c = tiny_config()
    c.train.update(dict(skip_nonfinite=True, **train))
    return c


def test_skipping_every_step_since_the_last_save_stops_the_run(tmp_path, monkeypatch):
    """Every step non-finite (what rope_base=0 did): stopped at the first save (orbax saves
    step 1 of a fresh run), nothing is saved, no eval.json, and the
    line blames the model or data, not the learning rate (step 1's is 0 under warm-up)."""
    monkeypatch.setattr(loop, "task_of", lambda config: _diverging(1))
    with pytest.raises(errors.NonFiniteError) as e:
        loop.train(_skip_config(), str(tmp_path), progress=False)
    assert "every step since the start (1-1) was non-finite and skipped: nothing was " \
        "trained" in str(e.value)
    assert "Step 1 is non-finite before any update" in str(e.value) and "train.lr" not in \
        str(e.value)
    assert rundir.steps(tmp_path) == [] and not (tmp_path / "eval.json").exists()


def test_too_many_skipped_steps_in_a_row_stop_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "task_of", lambda config: _diverging(2))
    with pytest.raises(errors.NonFiniteError, match=r"steps 2-3 were all non-finite and "
                       r"skipped \(more than train.max_skipped_in_a_row=1\).*Lower train.lr"):
        loop.train(_skip_config(max_skipped_in_a_row=1), str(tmp_path), progress=False)
    assert rundir.steps(tmp_path) == [1]           # orbax's first save, before step 2


def test_a_non_finite_final_evaluation_is_never_written(faults_base, tmp_path, monkeypatch):
    """The final checkpoint is there, eval.json is not: the evaluation alone runs again."""
    class NanEvaluation(lm.Training):
        def evaluate(self, state, split, step):
            result = super().evaluate(state, split, step)
            return {**result, "nll": math.nan} if split == "test" else result
    run = _copy(faults_base, tmp_path)
    monkeypatch.setattr(loop, "task_of", lambda config: NanEvaluation)
    with pytest.raises(errors.NonFiniteError, match=r"the final test evaluation of step 6 is "
                       r"non-finite \(test.nll=nan\); eval.json was not written"):
        loop.train(tiny_config(), str(run), progress=False)
    assert not (run / "eval.json").exists()


def test_clip_norm_zero_is_no_clipping():
    """clip_norm=0 used to clip every gradient to 0 and train nothing."""
    params = {"w": jnp.ones((4, 4)), "b": jnp.zeros(4)}
    grads = {"w": jnp.full((4, 4), 30.0), "b": jnp.full(4, -7.0)}
    tc = tiny_config().train
    tc.warmup_steps = 0                   # the first update's learning rate is train.lr

    def update(clip_norm):
        tc.clip_norm = clip_norm
        tx = optim.make_optimizer(tc)
        return tx.update(grads, tx.init(params), params)[0]
    adamw = optax.adamw(optim.schedule(tc), b1=tc.b1, b2=tc.b2, eps=tc.get("eps", 1e-8),
                        weight_decay=tc.weight_decay,
                        mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p))
    unclipped = adamw.update(grads, adamw.init(params), params)[0]
    chex.assert_trees_all_equal(update(0.0), unclipped)
    assert np.all(np.abs(np.asarray(update(0.0)["b"])) > 0.5 * tc.lr)   # b is not decayed


def test_the_spike_window_is_seeded_and_worse_than_chance_is_said():
    lines = []
    watch = guard.SpikeWatch(3.0, lines.append, chance=math.log(256))
    watch.seed([{"step": 2, "loss": 2.7}, {"step": 2, "split": "validation", "loss": 99.0},
                {"step": 4, "loss": 2.6}, {"step": 6, "loss": float("nan")},
                {"step": 6, "loss": 2.5}])
    assert list(watch.recent) == [2.7, 2.6, 2.5]
    watch.see(8, 5.9)                      # 2.27x the median, under 1.25 x ln 256: quiet
    watch.see(10, 22.0)
    watch.see(12, 23.0)
    assert lines[0].startswith("warning: loss spike at step 10: 22 is 8.3x the median 2.65")
    assert lines[1].startswith("warning: loss 22 at step 10 is 3.97x a uniform guess's 5.545: "
                               "the model predicts worse than chance")
    assert len([x for x in lines if "uniform guess" in x]) == 1     # said once


def test_rope_base_is_validated(tmp_path):
    c = tiny_config()
    c.model.rope_base = 0.0
    with pytest.raises(errors.ConfigError, match=re.escape(
            "model.rope_base=0.0 must be positive (the rotary base; the usual value is 10000)")):
        loop.train(c, str(tmp_path / "run"), progress=False)
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ the change record (3)

def _spiking_then_diverging():
    """lm.Training whose logged loss is 10x from step 7 (a spike, finite) and NaN from step 8."""
    class Spiking(lm.Training):
        def train_step(self, top_level=True):
            real = super().train_step(top_level)

            def step(state, tokens):
                new, metrics = real(state, tokens)
                loss = jnp.where(new["step"] >= 7, 10 * metrics["loss"], metrics["loss"])
                metrics = {**metrics, "loss": jnp.where(new["step"] >= 8, jnp.nan, loss)}
                return new, metrics
            return step
    return Spiking


def test_a_change_is_recorded_only_with_a_checkpoint_saved_under_it(faults_base, tmp_path,
                                                                      monkeypatch, capsys):
    """The finished 6-step run resumed with steps=9, log_every=1 diverges at step 8, before
    the save at 9: config_history.jsonl does not name the change, so the original command
    finds the run finished. The spike at step 7, right after the resume, is seen (the
    window is seeded from metrics.jsonl), and so is the loss above chance."""
    run = _copy(faults_base, tmp_path, unfinished=False)
    c = tiny_config()
    c.train.update(dict(steps=9, log_every=1, allow_changes=True))
    monkeypatch.setattr(loop, "task_of", lambda config: _spiking_then_diverging())
    with pytest.raises(errors.NonFiniteError, match="step 8 has a non-finite loss"):
        loop.train(c, str(run), progress=False)
    err = capsys.readouterr().err
    assert "warning: loss spike at step 7: " in err
    assert "a uniform guess's 5.545: the model predicts worse than chance" in err
    assert not (run / checkpoint.HISTORY).exists()
    monkeypatch.undo()
    loop.train(tiny_config(), str(run), progress=False)
    assert f"{run} is finished (step 6 of 6" in capsys.readouterr().out


def test_a_torn_history_line_is_said(faults_base, tmp_path, capsys):
    run = _copy(faults_base, tmp_path)
    (run / checkpoint.HISTORY).write_text('{"step": 6, "changes": ["train.steps: run has 6, ')
    assert checkpoint.check_same_run(run, tiny_config()) == []
    assert f"warning: dropped the torn last line of {run / checkpoint.HISTORY}" in \
        capsys.readouterr().err


def test_a_resume_past_train_steps_is_refused(faults_base, tmp_path):
    run = _copy(faults_base, tmp_path, unfinished=False)
    before = (run / "eval.json").read_bytes()
    c = tiny_config()
    c.train.update(dict(steps=4, allow_changes=True))
    with pytest.raises(errors.ConfigError, match=re.escape(
            f"{run} is at step 6, past train.steps=4: resume it with --config.train.steps=6 "
            "or more")):
        loop.train(c, str(run), progress=False)
    assert (run / "eval.json").read_bytes() == before


# ------------------------------------------------------------------ the data cache (5)

def test_concurrent_first_runs_share_a_fresh_data_cache(tmp_path):
    """Three first runs (a job array on a fresh node) build the same cache at once: each
    succeeds, no temp file is left, and the cache reads back whole."""
    from dynjax.data import text

    splits = {s: np.frombuffer(os.urandom(1 << 20), np.uint8) for s in text.SPLITS}
    for trial in range(5):
        cache = tmp_path / f"cache{trial}"
        start, failures = threading.Barrier(3), []

        def build():
            start.wait()
            try:
                text._write_cache(cache, splits)
            except Exception as e:  # noqa: BLE001  the race's error, reported below
                failures.append(e)
        threads = [threading.Thread(target=build) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        assert sorted(p.name for p in cache.iterdir()) == sorted(
            ["manifest.json", *(f"{s}.bin" for s in text.SPLITS)])
        read = text._read_cache(cache, json.loads((cache / "manifest.json").read_text()))
        chex.assert_trees_all_equal(read, splits)


# ------------------------------------------------------------------ tracebacks (4), --out (6)

def _cli(args, timeout=TIMEOUT, env=None):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env or dict(os.environ, JAX_PLATFORMS="cpu"))


def test_the_audits_run_loader_names_a_damaged_eval_json(faults_base, tmp_path):
    from dynjax.audit.targets.kinds import open_target

    run = _copy(faults_base, tmp_path, unfinished=False)
    text = (run / "eval.json").read_text()
    (run / "eval.json").write_text(text[:len(text) // 2])
    with pytest.raises(CorruptFile, match=rf"{run / 'eval.json'} is corrupt \(.*\): delete it "
                       "and re-run the run's train.py command"):
        open_target(run).step


@pytest.mark.subprocess
def test_plan_and_train_refuse_a_mesh_that_does_not_divide_the_model(tmp_path):
    """plan.py used to say "fits"; train.py met JAX's IndivisibleError at its first step."""
    from dynjax.parallel import sharding
    from dynjax.train import memory_plan

    c = tiny_config()
    with pytest.raises(ValueError, match=re.escape(
            "parameter ['embed']['embedding'] has a dimension of 256, which the mesh's "
            "tensor=3 does not divide")):
        memory_plan.plan(c, dict(data=1, fsdp=1, tensor=3), sharding.rules_of(dict(preset="tp")))
    out = _cli(["train.py", f"--workdir={tmp_path}/run", *TINY_FLAGS, "--config.train.steps=2",
                "--config.train.batch_size=30", "--config.sharding.preset=tp",
                "--config.sharding.mesh.data=1", "--config.sharding.mesh.tensor=3"],
               env=cpu_devices_env(3))
    assert out.returncode == 2, out.stderr[-3000:]
    assert "has a dimension of 256, which the mesh's tensor=3 does not divide" in _one_line(
        out.stderr, "train.py: error: parameter ")
    assert not (tmp_path / "run").exists()


@pytest.mark.subprocess
def test_a_gs_workdir_without_gcsfs_is_one_line_naming_the_package(tmp_path):
    pytest.importorskip("etils.epath")
    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed: the gs:// path works")
    out = _cli(["train.py", "--workdir=gs://bucket/run", *TINY_FLAGS, "--config.train.steps=2"])
    assert out.returncode == 2, out.stderr[-3000:]
    line = _one_line(out.stderr, "train.py: error: ")
    assert "Please install gcsfs to access Google Storage" in line and \
        "pip install gcsfs" in line


@pytest.mark.subprocess
def test_a_missing_peer_is_announced_and_one_line(tmp_path):
    """A process waiting for peers that never come: what it waits for, up front, then one
    line when the timeout passes (JAX's own timeout aborts with a C++ stack)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = _cli(["-c", "from dynjax.parallel import distributed; distributed.initialize("
                f"'127.0.0.1:{port}', 2, 1, timeout_s=3)"])
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.splitlines()[0] == f"waiting for 2 processes at 127.0.0.1:{port} " \
        "(timeout 3 s)"
    assert _one_line(out.stderr, "-c: error: ") == (
        f"-c: error: timed out after 3 s waiting for 2 processes at 127.0.0.1:{port}: start "
        "every process (the same --coordinator_address and --num_processes, each its own "
        "--process_id), check that process 0's address is reachable from this host, and run "
        "again")


@pytest.mark.subprocess
def test_scorecard_checks_its_output_before_any_audit(faults_base, tmp_path):
    (tmp_path / "file").write_text("")
    out = _cli(["scorecard.py", "--config=configs/scorecard.py", f"--out={tmp_path}/file/sc",
                "--config.audit.reassignments=2", "--config.audit.data.eval_windows=8",
                "--config.audit.data.calib_windows=8", "--config.audit.stats.n_resamples=99",
                "--config.latency_repeats=1", str(faults_base[0])])
    assert out.returncode == 2, out.stderr[-3000:]
    assert _one_line(out.stderr, "scorecard.py: error: ").startswith(
        f"scorecard.py: error: cannot write {tmp_path}/file/sc: Not a directory (--out;")
    assert "auditing" not in out.stdout + out.stderr


# ------------------------------------------------------------------ messages (8)

def test_a_step_never_saved_is_named_with_the_saved_ones(faults_base):
    with pytest.raises(errors.CheckpointError, match=re.escape(
            f"run {faults_base[0]} has no checkpoint step 7 (saved: 3, 6); pass one of them")):
        rundir.load_params(faults_base[0], 7)


def test_a_config_that_does_not_match_the_checkpoint_is_named(faults_base, tmp_path):
    run = _copy(faults_base, tmp_path, unfinished=False)
    config = json.loads((run / "config.json").read_text())
    config["model"]["d_ff"] = 128
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(errors.CheckpointError) as e:
        rundir.load_params(run)
    assert "does not match config.json's model" in str(e.value)
    assert "moves the damaged step aside" not in str(e.value)


def test_a_full_disk_during_an_append_names_the_file(tmp_path):
    from dynjax.train.metrics import append_line

    with pytest.raises(OSError) as e:
        append_line("/dev/full", {"step": 1})
    assert errors.describe_os_error(e.value).startswith(
        "cannot write /dev/full: No space left on device (errno 28, ENOSPC)")


def test_an_atomic_write_onto_a_folder_names_the_folder(tmp_path):
    from dynjax.jsonio import write_json_atomic

    with pytest.raises(OSError) as e:
        write_json_atomic(tmp_path, {"a": 1})
    assert e.value.filename == str(tmp_path) and not list(tmp_path.iterdir())


# ------------------------------------------------------------------ signals (7)

@pytest.mark.subprocess
def test_sighup_and_sigusr1_stop_like_sigterm():
    """Slurm's --signal=USR1@90 and a closed ssh session: flagged for the loop (which saves
    and stops), not a kill."""
    code = ("import signal\nfrom dynjax.train import preempt\n"
            "for s in (signal.SIGHUP, signal.SIGUSR1):\n"
            "    with preempt.StopOnSignal() as stop:\n"
            "        signal.raise_signal(s)\n"
            "    print(signal.Signals(stop.signum).name)\n")
    out = _cli(["-c", code], timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["SIGHUP", "SIGUSR1"]
    assert "train.py: SIGUSR1 received: saving a checkpoint at the end of this step" in \
        out.stderr


def test_a_signal_during_the_final_evaluation_exits_after_it(faults_base, tmp_path,
                                                              monkeypatch):
    class Signalling(lm.Training):
        def evaluate(self, state, split, step):
            if split == "validation":
                signal.raise_signal(signal.SIGTERM)
            return super().evaluate(state, split, step)
    run = _copy(faults_base, tmp_path)
    monkeypatch.setattr(loop, "task_of", lambda config: Signalling)
    with pytest.raises(preempt.Preempted) as e:
        loop.train(tiny_config(), str(run), progress=False)
    assert (e.value.signum, e.value.step) == (signal.SIGTERM, 6)
    assert str(e.value) == ("stopped by SIGTERM after the final evaluation of step 6: the run "
                            f"is finished ({run}/eval.json written)")
    assert json.loads((run / "eval.json").read_text()) == faults_base[1]


def _handles(pid: int, sig) -> bool:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


@pytest.mark.subprocess
def test_a_signal_before_training_begins_exits_at_once(tmp_path):
    """SIGINT as soon as train.py's handlers are in (it is still importing JAX): exit 130
    with one line, nothing trained; it used to be swallowed by a JAX callback."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "train.py", f"--workdir={run}", *TINY_FLAGS,
                             "--config.train.steps=2"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"))
    try:
        deadline = time.monotonic() + 60
        while not _handles(proc.pid, signal.SIGUSR1):   # python's own handles SIGINT already
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.002)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-3000:]
    assert _one_line(err, "train.py: SIGINT received: ") == (
        "train.py: SIGINT received: exiting (not training: nothing to save)")
    assert "KeyboardInterrupt" not in err and not (run / "eval.json").exists()
