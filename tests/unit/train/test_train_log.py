"""The log interval (dynjax.train.metrics.Interval) and the warm-up clamp, without a
trainer run: the interval's mean loss, its resume from a mid-interval checkpoint, its
clock without compile, evaluation and saves; ``--config.train.steps=50`` on a config made
for 1000. The loop's own lines and means: tests/integration/train/test_train.py (straight_run)."""
import json
import time

import numpy as np

from dynjax.train import optim
from dynjax.train.metrics import PARTIAL, Interval
from tests.conftest import tiny_config

LOSSES = np.float32([2.5, 2.25, 2.0078125, 1.75, 1.5])


def test_interval_mean_and_resume_at_a_mid_interval_checkpoint(tmp_path):
    straight = Interval(tmp_path / "a", 0, active=True)
    (tmp_path / "a").mkdir()
    for x in LOSSES[:2]:
        straight.add(x)
    assert straight.close(2)[0] == np.mean(LOSSES[:2].astype(np.float64))
    for x in LOSSES[2:]:
        straight.add(x)
    expected = straight.close(5)[0]
    assert expected == sum(map(float, LOSSES[2:])) / 3

    (tmp_path / "b").mkdir()          # the same run, stopped after a checkpoint at step 3
    stopped = Interval(tmp_path / "b", 0, active=True)
    for x in LOSSES[:2]:
        stopped.add(x)
    stopped.close(2)
    stopped.add(LOSSES[2])
    stopped.keep_partial(3)
    assert json.loads((tmp_path / "b" / PARTIAL).read_text()) == {"3": [float(LOSSES[2]), 1]}
    resumed = Interval(tmp_path / "b", 3, active=True)
    for x in LOSSES[3:]:
        resumed.add(x)
    assert resumed.close(5)[0] == expected             # bitwise: the same float64 sum
    fresh = Interval(tmp_path / "b", 2, active=True)    # resumed at a log step: empty
    assert (fresh.sum, fresh.n) == (0.0, 0)


def test_interval_clock_leaves_out_the_first_step_evaluation_and_saves(tmp_path):
    iv = Interval(tmp_path, 0, active=False)
    iv.add(np.float32(1.0))
    time.sleep(0.05)                   # the first step: compile
    iv.start_clock(np.zeros(()), 1)
    for _ in range(3):
        iv.add(np.float32(1.0))
    time.sleep(0.05)                   # three steps of training
    with iv.excluded():
        time.sleep(0.4)                # an evaluation
    mean, steps, seconds = iv.close(4)
    assert (mean, steps) == (1.0, 3) and 0.05 <= seconds < 0.3, seconds
    assert not (tmp_path / PARTIAL).exists()        # inactive: nothing written
    iv.keep_partial(4)
    assert not (tmp_path / PARTIAL).exists()
    iv.add(np.float32(3.0))
    iv.add(np.float32(np.nan))         # a skipped non-finite step is not averaged
    assert iv.close(6)[:2] == (3.0, 2)


def test_warmup_is_clamped_to_a_short_run_with_one_line():
    c = tiny_config()
    c.train.update(dict(steps=50, warmup_steps=100))
    said = []
    clamped = optim.clamp_warmup(c, log=said.append)
    assert clamped.train.warmup_steps == 5 and c.train.warmup_steps == 100
    assert said == ["note: train.warmup_steps=100 exceeds train.steps=50: warming up over 5 "
                    "steps (a tenth of the run); set --config.train.warmup_steps to choose"]
    optim.check_train_config(clamped.train)
    c.train.update(dict(steps=6, warmup_steps=2))
    assert optim.clamp_warmup(c, log=said.append) is c and len(said) == 1
    c.train.update(dict(steps=3, warmup_steps=10))
    assert optim.clamp_warmup(c, log=None).train.warmup_steps == 1
