"""DeepSeek's auxiliary-loss-free selection biases live in the train state: a resumed run of
the routing study's deepseek_sigmoid arm equals the uninterrupted one, biases included."""
import shutil

import chex
import numpy as np

from dynjax.runs import rundir
from dynjax.train import loop
from tests.integration.train.test_train import truncate_arrays
from tests.unit.models.test_routing_arms import train_config


def test_the_bias_resumes_bitwise(tmp_path):
    """4 steps, checkpoints at 2 and 4; a copy whose step-4 checkpoint is cut short resumes
    from step 2 (biases already moved) and retrains steps 3-4 to the same parameters."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    loop.train(train_config("deepseek_sigmoid", 4), str(straight), progress=False)
    shutil.copytree(straight, resumed)
    truncate_arrays(resumed / "checkpoints" / "4")
    loop.train(train_config("deepseek_sigmoid", 4), str(resumed), progress=False)
    chex.assert_trees_all_equal(rundir.load_params(resumed)[2],
                                rundir.load_params(straight)[2])
    at_2 = np.stack([p["moe"]["router_bias"] for p in rundir.load_params(straight, 2)[2]["layers"]])
    assert np.any(at_2 != 0) and np.all(np.abs(at_2) <= 2 * 1e-3 + 1e-9)
