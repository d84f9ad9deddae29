"""TensorBoard event files beside metrics.jsonl (issue 33): every numeric field of every
record, at its step, read back from the files' own bytes (CRC-checked TFRecord framing,
tensorboardX's Event protos); resume leaves no step twice; gs:// through etils.epath."""
from __future__ import annotations

import collections
import shutil

import numpy as np
import pytest
from etils import epath
from fsspec.implementations.memory import MemoryFileSystem

from dynjax.runs import rundir
from dynjax.jsonio import check_writable, read_json, read_jsonl, write_json_atomic
from dynjax.train import loop
from dynjax.train.metrics import RunLog
from dynjax.train.tensorboard import event_files, read_events, read_scalars
from tests.conftest import tiny_config


def flat(record: dict) -> list[tuple[str, int, float]]:
    """The test's own reading of a metrics.jsonl line as TensorBoard series: split/field,
    list index or dict key appended, numbers only, float32 as TensorBoard stores them; an
    evaluation's ``windows`` (a count, not a series) is not one."""
    split, step, out = record.get("split", "train"), record["step"], []

    def walk(tag, v):
        if isinstance(v, dict):
            [walk(f"{tag}/{k}", x) for k, x in v.items() if k != "windows"]
        elif isinstance(v, list):
            [walk(f"{tag}/{i}", x) for i, x in enumerate(v)]
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append((tag, step, float(np.float32(v))))
    for k, v in record.items():
        if k not in ("step", "split", "windows"):
            walk(f"{split}/{k}", v)
    return out


def expected(run) -> collections.Counter:
    return collections.Counter(t for r in read_jsonl(epath.Path(run) / rundir.METRICS)
                               for t in flat(r))


def mod_config(steps=6):
    c = tiny_config("dense")
    c.model.update(dict(family="mod", variant="mod", n_layers=4, mod_every=2, mod_capacity=0.25))
    c.train.update(dict(steps=steps, log_every=2, ckpt_every=3))
    return c


def test_events_equal_metrics_jsonl_and_resume_logs_no_step_twice(tmp_path):
    run = tmp_path / "mod"
    loop.train(mod_config(), str(run), progress=False)
    got = collections.Counter(read_scalars(run))
    assert got == expected(run)
    assert not [tag for tag, _, _ in got if tag.endswith("/windows")]
    tags = {t for t, _, _ in got}
    # learning rate, gradient norm, loss, MoD entry rate per block (the model's blocks 1, 3)
    assert {"train/lr", "train/grad_norm", "train/loss", "train/mod_enter_rate_per_block/1",
            "train/mod_enter_rate_per_block/3", "validation/bpb", "test/bpb"} <= tags
    assert not any(t.startswith("train/mod_enter_rate_per_block/0") for t in tags)
    lr = {s: v for t, s, v in got if t == "train/lr"}
    # warm-up 2 steps to 3e-3: the update of 0-based step 1 (logged at step 2) uses half
    assert lr[2] == pytest.approx(1.5e-3, rel=1e-6)

    # a run killed after step 6's log lines but before its checkpoint, with the last event
    # file's tail never flushed: resume at 3 drops steps 4-6 from both logs and re-logs them
    shutil.rmtree(run / "checkpoints" / "6")
    (run / rundir.EVAL).unlink()
    (f,) = event_files(run)
    data = f.read_bytes()
    f.write_bytes(data[:len(data) - 300])
    loop.train(mod_config(), str(run), progress=False)
    assert len(event_files(run)) == 1
    got = collections.Counter(read_scalars(run))
    assert got == expected(run)
    assert max(collections.Counter((t, s) for t, s, _ in got.elements()).values()) == 1
    assert sorted(s for t, s, _ in got if t == "train/loss") == [2, 4, 6]


def test_moe_load_per_expert_is_logged_per_layer(tmp_path):
    c = tiny_config("dense")
    c.model.update(dict(family="moe", variant="moe", moe_num_experts=4,
                        moe_num_experts_per_tok=2))
    c.train.update(dict(steps=2, log_every=1, ckpt_every=2))
    loop.train(c, str(tmp_path), progress=False)
    got = collections.Counter(read_scalars(tmp_path))
    assert got == expected(tmp_path)
    load = {(t, s): v for t, s, v in got if t.startswith("train/moe_load_per_expert/")}
    assert len(load) == 2 * 3 * 4                    # 2 log points x 3 layers x 4 experts
    for layer in range(3):
        total = sum(v for (t, s), v in load.items() if t.split("/")[2] == str(layer) and s == 1)
        assert total == pytest.approx(1.0, abs=1e-6)  # shares of each layer's routes


def test_run_directory_files_on_gs_through_epath(memory_gcs):
    run = memory_gcs
    check_writable(run, "--workdir")
    write_json_atomic(f"{run}/{rundir.CONFIG}", {"seed": 0})
    assert read_json(f"{run}/{rundir.CONFIG}") == {"seed": 0}
    log = RunLog(run, resume_step=0)
    for step in (1, 2, 3):
        log.write({"step": step, "loss": 1.0 / step, "gate_mass_per_layer": [0.5, 0.25]})
        log.flush()
    log.close()
    assert "bucket/run/metrics.jsonl" in MemoryFileSystem.store   # really in the store
    assert collections.Counter(read_scalars(run)) == expected(run)
    log = RunLog(run, resume_step=2)                 # resume at step 2: step 3 goes
    log.write({"step": 3, "loss": 0.3})
    log.flush()
    assert [r["step"] for r in read_jsonl(f"{run}/{rundir.METRICS}")] == [1, 2, 3]
    assert collections.Counter(read_scalars(run)) == expected(run)
    assert len(event_files(run)) == 1 and read_events(event_files(run)[0])[0].file_version
