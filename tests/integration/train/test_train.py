"""train.py's loop: loss falls on real text, resume is bitwise, metrics, errors, mass match."""
import contextlib
import io
import json
import os
import pathlib
import shutil
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest

from dynjax.runs import rundir
from dynjax.errors import CheckpointError, ConfigError
from dynjax.jsonio import read_jsonl
from dynjax.models import build
from dynjax.train import checkpoint, evaluation, lm, loop, optim
from tests.conftest import ROOT, tiny_config


COMPILED = []   # the programs straight_run's loop compiled, by name


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """One 6-step feature_gate run, shared by the tests below."""
    run = tmp_path_factory.mktemp("straight")

    def compiled(event, seconds, **kw):
        if event == "/jax/core/compile/backend_compile_duration":
            COMPILED.append(kw.get("fun_name"))
    jax.monitoring.register_event_duration_secs_listener(compiled)
    try:
        with contextlib.redirect_stderr(io.StringIO()) as out:   # a batch job's log
            result = loop.train(tiny_config("feature_gate"), str(run), progress=True)
    finally:
        jax.monitoring.unregister_event_duration_listener(compiled)
    LOG.extend(out.getvalue().splitlines())
    return run, result


LOG = []   # what straight_run printed to stderr (not a terminal)


def test_the_train_step_compiles_once(straight_run):
    """Six steps, one compiled train step (the guard's ``step``, which holds the task's):
    the guard's record starts where the step leaves it (replicated over the mesh). Before,
    the second step's record had another sharding than the first's and every run compiled
    its train step twice (explain_cache_misses: record['first_bad'] i32[]({Auto: mesh}) vs
    i32[]({}))."""
    assert COMPILED.count("jit(step)") == 1, COMPILED


def _params(run):
    return rundir.load_params(run)[2]


def test_loss_falls_on_real_text(tmp_path):
    c = tiny_config("feature_gate")
    c.train.update(dict(steps=40, log_every=5, ckpt_every=40, warmup_steps=5, lr=1e-2))
    loop.train(c, str(tmp_path), progress=False)
    losses = [r["loss"] for r in read_jsonl(tmp_path / "metrics.jsonl") if "split" not in r]
    assert losses[-1] < losses[0] - 1.0, losses  # from ~ln 256 nats toward byte statistics


def test_resume_equals_uninterrupted(straight_run, tmp_path):
    run, _ = straight_run
    c = tiny_config("feature_gate")
    c.train.steps = 3                                   # stop after the first checkpoint
    loop.train(c, str(tmp_path), progress=False)
    c.train.steps = 6
    with pytest.raises(ConfigError, match=r"other train settings \(train.steps: run has 3, "
                       r"config has 6\).*allow_changes=true"):
        loop.train(c, str(tmp_path), progress=False)            # a changed train.* field
    c.train.allow_changes = True
    resumed = loop.train(c, str(tmp_path), progress=False)
    assert json.loads((tmp_path / "config.json").read_text())["train"]["steps"] == 3
    (change,) = read_jsonl(tmp_path / "config_history.jsonl")
    assert change["step"] == 3 and change["changes"] == ["train.steps: run has 3, config has 6"]
    a, b = _params(run), _params(tmp_path)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)
    assert resumed["test"]["nll"] == straight_run[1]["test"]["nll"]
    steps = [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl") if "split" not in r]
    # the stopped run logged its last step (3); nothing is duplicated or lost on resume
    assert steps == [2, 3, 4, 6]


def test_rundir_opens_the_params_alone_at_every_step(straight_run):
    """dynjax.runs.rundir restores the ``params`` subtree only (no optimizer built), bitwise the
    train state's params at each saved step."""
    run, _ = straight_run
    assert rundir.steps(run) == [3, 6]
    task = lm.Training(rundir.read_config(run))
    target = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          task.abstract, task.state_shardings)
    mngr = checkpoint.manager(run, every=1, keep=10)
    for step in (3, 6):
        opened = rundir.load(run, step)
        assert opened.step == step and opened.model.cfg == task.model.cfg
        chex.assert_trees_all_equal(jax.device_get(opened.params),
                                    jax.device_get(checkpoint.restore(mngr, target, step)["params"]))
    assert rundir.load(run).step == 6


@pytest.mark.subprocess
def test_audit_and_rundir_import_no_training_code():
    """Layers run one way: opening a run for the audit never imports the trainer, and the
    trainer, which reads runs through ``dynjax.runs.rundir``, never imports the audit (the
    checkpoint targets live in ``dynjax.audit.targets``)."""
    for imported, above in (("dynjax.runs.rundir, dynjax.audit.targets", "dynjax.train"),
                            ("dynjax.train.loop", "dynjax.audit")):
        code = (f"import sys, {imported}; "
                f"print(sorted(m for m in sys.modules if m.startswith('{above}')))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == "[]", imported


def test_run_directory_contents(straight_run):
    run, result = straight_run
    config = json.loads((run / "config.json").read_text())
    assert config["model"]["variant"] == "feature_gate"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["3", "6"]
    ev = json.loads((run / "eval.json").read_text())
    for split in ("validation", "test"):
        assert ev[split]["windows"] == 16
        assert len(ev[split]["gate_mass_per_layer"]) == 3
        assert ev[split]["gate_mass"] == pytest.approx(np.mean(ev[split]["gate_mass_per_layer"]))
        assert ev[split]["bpb"] == pytest.approx(ev[split]["nll"] / np.log(2))
    rec = [r for r in read_jsonl(run / "metrics.jsonl") if "split" not in r][-1]
    assert {"step", "loss", "bpb", "tokens_per_s", "gate_mass_per_layer", "grad_norm"} <= set(rec)
    assert result["test"] == ev["test"]


def test_mass_matched_uniform(straight_run, tmp_path):
    run, result = straight_run
    c = tiny_config("uniform")
    c.mass_match_run = str(run)
    c.train.steps = 2
    out = loop.train(c, str(tmp_path), progress=False)
    target = result["validation"]["gate_mass"]
    assert json.loads((tmp_path / "config.json").read_text())["model"]["uniform_value"] == target
    assert out["test"]["gate_mass"] == pytest.approx(target, rel=1e-6)


def test_a_family_with_its_own_xla_options_trains_through_the_loop(tmp_path):
    """MUDD's step carries XLA:CPU options (families.py); the loop compiles it inside the
    non-finite guard's jit, which must then be the one that carries them."""
    from configs import mudd_tiny

    c = tiny_config()
    c.model = mudd_tiny.get_config("mudd").model
    c.model.update(dict(d_model=32, n_heads=2, n_layers=2, d_ff=64, mudd_da_hidden=8))
    c.train.update(steps=2, ckpt_every=2)
    result = loop.train(c, str(tmp_path), progress=False)
    assert np.isfinite(result["validation"]["bpb"])


def test_bad_configs_give_clear_errors(straight_run, tmp_path):
    c = tiny_config("dense")
    c.mass_match_run = str(tmp_path)
    with pytest.raises(ValueError, match="mass_match_run is only meaningful"):
        loop.train(c, str(tmp_path / "a"), progress=False)
    c = tiny_config("uniform")
    c.mass_match_run = str(tmp_path)
    with pytest.raises(ValueError, match="no eval.json"):
        loop.train(c, str(tmp_path / "b"), progress=False)
    c = tiny_config("feature_gate")
    c.train.steps = 0
    with pytest.raises(ValueError, match="train.steps"):
        loop.train(c, str(tmp_path / "c"), progress=False)
    c = tiny_config("feature_gate", d_model=64)     # resuming with another architecture
    with pytest.raises(ConfigError, match=r"different config \(model.d_model: run has 32, config has 64\)"):
        loop.train(c, str(straight_run[0]), progress=False)


@pytest.mark.subprocess
def test_train_cli_overrides(tmp_path):
    """The command line: --config.field overrides and the printed bits per byte."""
    cmd = [sys.executable, "train.py", "--config=configs/tiny.py:layer_static",
           f"--workdir={tmp_path}", "--config.train.steps=2", "--config.model.d_model=32",
           "--config.model.n_heads=2", "--config.model.d_ff=64", "--config.model.n_layers=2",
           "--config.data.seq_len=32", "--config.train.batch_size=4",
           "--config.eval.windows=8", "--config.eval.batch_size=8",
           "--config.train.warmup_steps=1"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "test:" in out.stdout and "bits/byte" in out.stdout
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model"]["variant"] == "layer_static" and config["model"]["d_model"] == 32
    # the last step is checkpointed although it is not a multiple of train.ckpt_every: the
    # checkpoint an audit loads is the model eval.json scored
    assert config["train"]["steps"] % config["train"]["ckpt_every"] != 0
    assert max(int(p.name) for p in (tmp_path / "checkpoints").iterdir()) == 2
    no_data = _cli(cmd[1:] + ["--config.data.source=files", "--config.data.path=/absent",
                              f"--workdir={tmp_path}/y"])
    _assert_one_line_error(no_data, "train.py", "data.path='/absent' does not exist")
    assert not (tmp_path / "y").exists()            # data checked before the run directory


# ------------------------------------------------------------- damaged checkpoints, CLI errors

def truncate_arrays(step_dir):
    """Cut every array file of an orbax checkpoint step to 10 bytes (a copy cut short)."""
    files = [f for f in pathlib.Path(step_dir).rglob("*") if f.is_file() and f.parent.name == "d"]
    assert files
    for f in files:
        os.truncate(f, 10)


def test_resume_falls_back_past_a_damaged_checkpoint(straight_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(straight_run[0], run)
    truncate_arrays(run / "checkpoints" / "6")
    result = loop.train(tiny_config("feature_gate"), str(run), progress=False)
    err = capsys.readouterr().err
    assert f"warning: checkpoint step 6 of {run} cannot be restored (" in err
    assert "resumed from step 3, the newest that restores" in err
    assert (run / "unrestorable_checkpoints" / "6").is_dir()      # kept, not deleted
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["3", "6"]
    # steps 4-6 retrained from step 3 give the uninterrupted run's parameters bit for bit
    chex.assert_trees_all_equal(_params(run), _params(straight_run[0]))
    assert result["test"] == straight_run[1]["test"]


def test_guarded_read_passes_on_a_successful_reads_stderr_and_drops_a_failed_ones(capfd):
    """What I/O threads write to file descriptor 2 during a read reaches stderr after a
    success (a warning is not lost) and is dropped after a failure (one clear line)."""
    with rundir.guarded_read():
        os.write(2, b"orbax warning during a good read\n")
    assert "orbax warning during a good read" in capfd.readouterr().err
    with pytest.raises(ValueError, match="bad file"):
        with rundir.guarded_read():
            os.write(2, b"Traceback from a tensorstore thread\n")
            raise ValueError("bad file")
    assert "tensorstore" not in capfd.readouterr().err
    os.write(2, b"stderr is back\n")
    assert "stderr is back" in capfd.readouterr().err


def test_no_restorable_checkpoint_is_a_clear_error(straight_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(straight_run[0], run)
    for step in ("3", "6"):
        (run / "checkpoints" / step / "default" / "_METADATA").unlink()
    with pytest.raises(CheckpointError, match=r"no checkpoint of .* can be restored \(step 6: "
                       r".*; step 3: .*\); delete .*checkpoints and .*metrics.jsonl"):
        loop.train(tiny_config("feature_gate"), str(run), progress=False)
    assert not (run / "unrestorable_checkpoints").exists()        # nothing moved


def _cli(args, timeout=120):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, JAX_PLATFORMS="cpu"))


def _assert_one_line_error(out, prog, message):
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.startswith(f"{prog}: error: ")]
    assert len(lines) == 1 and message in lines[0], out.stderr[-2000:]


TINY = ["--config.model.d_model=32", "--config.model.n_heads=2", "--config.model.d_ff=64",
        "--config.model.n_layers=2", "--config.data.seq_len=32", "--config.train.batch_size=4"]


@pytest.mark.subprocess
@pytest.mark.parametrize("args, message", [
    (["--config=configs/tiny.py:sparse"], "unknown variant 'sparse'"),
    (["--config=configs/tiny.py:feature_gate", "--config.train.steps=-1"],
     "train.steps=-1 must be positive"),
    (["--config=configs/tiny.py:feature_gate", "--config.train.stepz=3"],
     "bad command line: 'stepz'; Did you mean \"steps\""),
    (["--config=configs/tiny.py:feature_gate", "--config.train.steps=many"],
     "invalid literal for int()"),
    (["--config=configs/tiny.py:feature_gate", "--config.sharding.mesh.tensor=3"],
     "'tensor': 3} does not divide the 1 available devices"),
    (["--config=configs/tiny.py:feature_gate", "--coordinator_address=127.0.0.1:1",
      "--num_processes=2", "--process_id=5"], "--process_id=5 must be in 0..1"),
    (["--config=configs/mod_tiny.py:mod", "--config.data.seq_len=4"],
     "MoD capacity k = floor(0.125 * 4) = 0"),
], ids=["variant", "steps", "unknown-field", "type", "devices", "process-id", "seq-len"])
def test_train_config_errors_are_one_line(tmp_path, args, message):
    workdir = tmp_path / "run"
    out = _cli(["train.py", f"--workdir={workdir}", *args[:1], *TINY[:-2], *args[1:]])
    _assert_one_line_error(out, "train.py", message)
    assert not workdir.exists()                     # refused before the run directory


def test_a_run_made_before_its_config_gained_a_field_still_resumes(tmp_path):
    """configs/mode_tiny.py and moe_tiny.py gained model.moe_dispatch="onehot" (so that
    --config.model.moe_dispatch=dropless works): a run whose config.json predates the field
    trained one-hot, and resumes; a dropless config on it is still a different run."""
    from configs import moe_tiny
    c = moe_tiny.get_config("moe")
    old = c.to_dict()
    del old["model"]["moe_dispatch"]
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert checkpoint.check_same_run(tmp_path, c) == []
    c.model.moe_dispatch = "dropless"
    with pytest.raises(ConfigError, match=r"model.moe_dispatch: run has None, config has "
                       r"'dropless'"):
        checkpoint.check_same_run(tmp_path, c)


@pytest.mark.subprocess
def test_train_refuses_another_configs_run_directory(straight_run):
    """scripts/main.sh re-run on a run directory trained with a different config."""
    run = straight_run[0]
    before = (run / "config.json").read_text()
    out = _cli(["train.py", "--config=configs/tiny.py:feature_gate", f"--workdir={run}"])
    _assert_one_line_error(out, "train.py", f"{run} holds a run trained with a different config "
                           "(model.d_ff: run has 64, config has 512; model.d_model: run has 32, "
                           "config has 128; model.n_heads: run has 2, config has 4; 3 more); use "
                           "a new --workdir (scripts/main.sh: RUN=NEW_DIR)")
    assert (run / "config.json").read_text() == before


@pytest.mark.subprocess
@pytest.mark.parametrize("args, message", [
    (["--config.gate.lambda_g=-1"], "gate.lambda_g and the gate schedule lengths must be >= 0"),
    (["--config.train.batch_size=0"], "train.batch_size=0 must be positive"),
    (["--config.data.dataset=cifar"], "unknown data.dataset='cifar'"),
], ids=["lambda", "batch", "dataset"])
def test_classifier_config_errors_are_one_line(tmp_path, args, message):
    workdir = tmp_path / "run"
    out = _cli(["train.py", "--config=configs/dgmlp_mnist.py:dgate", f"--workdir={workdir}",
                *args])
    _assert_one_line_error(out, "train.py", message)
    assert not workdir.exists()


@pytest.mark.subprocess
def test_audit_names_a_damaged_checkpoint(straight_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(straight_run[0], run)
    truncate_arrays(run / "checkpoints" / "6")                       # a copy cut short
    out = _cli(["audit.py", "--config=configs/audit_tiny.py", f"--out={tmp_path}/audit",
                f"--checkpoints={run}"])
    _assert_one_line_error(out, "audit.py", f"checkpoint step 6 of run {run} cannot be "
                           "restored (")
    assert f"re-run its train.py command with --workdir={run}" in out.stderr


@pytest.fixture(scope="module")
def hand_steps():
    """straight_run's steps made by hand (lm.make_train_step, jitted once): from the seed's
    state on the batches of (seed, s) for s = 0..5, the params after the first three and each
    step's loss, and the params after three steps on batch 0."""
    from dynjax.data import text as text_data

    config = tiny_config("feature_gate")
    model = build(config.model.to_dict())
    step_fn = jax.jit(lm.make_train_step(model, optim.make_optimizer(config.train)))
    split = text_data.load_splits(config.data.source)["train"]
    batch = lambda s: text_data.train_batch(split, config.data.seq_len,  # noqa: E731
                                            config.train.batch_size, config.seed, s)
    fresh = lambda: lm.init_state(config, model, jax.random.key(config.seed))  # noqa: E731
    state, losses, params = fresh(), [], {}
    for s in range(6):
        state, m = step_fn(state, batch(s))
        losses.append(float(m["loss"]))
        if s == 2:
            params[0, 1, 2] = state["params"]
    state = fresh()
    for s in (0, 0, 0):
        state, _ = step_fn(state, batch(s))
    params[0, 0, 0] = state["params"]
    return params, losses


def test_each_step_trains_on_its_own_batch(straight_run, hand_steps):
    """The loop feeds step s the batch of (seed, s): its checkpoint at step 3 equals three
    hand-made steps on batches 0, 1, 2, and not three steps on one batch (a loop reusing a
    batch, or skipping one, would still resume bitwise; this catches it)."""
    run, _ = straight_run
    params_after, _ = hand_steps
    trained = rundir.load(run, step=3).params
    chex.assert_trees_all_equal(params_after[0, 1, 2], trained)
    with pytest.raises(AssertionError):
        chex.assert_trees_all_close(params_after[0, 0, 0], trained, rtol=1e-4, atol=1e-6)


def test_evaluation_averages_the_real_windows_not_the_padding():
    """A last batch padded to the compiled shape: the padding's losses and gate mass are
    dropped, so any batch size gives the mean over the same windows."""
    model = build(tiny_config("feature_gate").model.to_dict())
    windows = np.random.default_rng(0).integers(0, 256, (5, 32)).astype(np.int32)
    params = model.init(jax.random.key(0), windows[:1])
    step = evaluation.make_eval_step(model)
    padded = evaluation.evaluate(step, params, windows, batch_size=4)   # 4, then 1 + 3 pad
    whole = evaluation.evaluate(step, params, windows, batch_size=5)
    assert padded["windows"] == whole["windows"] == 5
    np.testing.assert_allclose(padded["nll"], whole["nll"], rtol=1e-6)
    np.testing.assert_allclose(padded["gate_mass_per_layer"], whole["gate_mass_per_layer"],
                               rtol=1e-6)


def test_a_log_file_gets_one_line_per_log_step_with_the_interval_mean(straight_run,
                                                                      hand_steps):
    """stderr not a terminal: one line per log step (no bar), whose loss is the record's,
    the mean of the interval's per-step losses (recomputed here by hand-made steps; before,
    train/loss was the log step's batch alone)."""
    run, _ = straight_run
    records = [r for r in read_jsonl(run / "metrics.jsonl") if "split" not in r]
    steps = [line for line in LOG if line.startswith("step ")]
    assert [r["step"] for r in records] == [2, 4, 6] and len(steps) == 3, LOG
    assert not [line for line in LOG if "\r" in line or "it/s" in line]      # no tqdm bar
    for line, r in zip(steps, records):
        parts = line.split(" | ")
        assert parts[:3] == [f"step {r['step']}/6", f"loss {r['loss']:.4f}",
                             f"bpb {r['bpb']:.4f}"], line
        assert parts[3].endswith(" s/step") and parts[4].endswith(" tok/s") and \
            parts[5].startswith("eta ")
        assert r["tokens_per_s"] > 0
    _, losses = hand_steps
    np.testing.assert_allclose([r["loss"] for r in records],
                               [np.mean(losses[i:i + 2]) for i in (0, 2, 4)], rtol=1e-6)
    np.testing.assert_allclose([r["bpb"] for r in records],
                               [r["loss"] / np.log(2) for r in records], rtol=1e-12)
