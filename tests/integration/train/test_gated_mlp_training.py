"""DynamicGate-MLP training (the unit tier's tests/unit/models/test_gated_mlp.py holds the
model's promises): a larger budget weight lowers the open rate, and the classifier loop
resumes to the same result and feeds step s its own batch."""
import chex
import jax
import ml_collections
import numpy as np
import pytest

from configs import mlp_common
from dynjax.data import tabular
from dynjax.models.gated_mlp import GatedMLP
from dynjax.runs import rundir
from dynjax.train import classify, loop


def _train_open_rate(lambda_g, steps=90):
    config = mlp_common.base("dgate", "mnist5k")
    config.model.update(hidden=(32, 32), gate_hidden=8, min_keep=0.0, tau=1.0)
    config.gate.update(warmup_steps=10, anneal_steps=20, ramp_steps=20, lambda_g=lambda_g)
    config.train.update(steps=steps, batch_size=32, lr=3e-3, warmup_steps=5)
    model = GatedMLP(rundir.classifier_model_dict(config, 12, 3))
    tx = classify.make_tx(config)
    state = classify.init_state(model, tx, jax.random.key(0))
    step = classify.make_train_step(config, model, tx)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 12)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0.5)
    for s in range(steps):
        xb, yb = tabular.batches(x, y, 32, 0, s)
        state, metrics = step(state, xb, yb)
    return float(np.mean(metrics["open_rate_per_layer"]))


def test_larger_lambda_lowers_open_rate():
    low, high = _train_open_rate(0.0), _train_open_rate(3.0)
    assert high < low - 0.1, (low, high)


def test_classify_end_to_end_resumes(tmp_path):
    """Real data (scripts/setup.sh fetches it): train, checkpoint, resume to the same result."""
    config = mlp_common.base("dgate", "mnist5k")
    config.model.update(hidden=(64, 64))
    config.gate.update(warmup_steps=5, anneal_steps=10, ramp_steps=10)
    config.train.update(steps=30, batch_size=64, lr=3e-3, warmup_steps=5, ckpt_every=20,
                        eval_every=20, log_every=10)
    config.eval.batch_size = 256
    first = loop.train(config, str(tmp_path / "a"), progress=False)
    assert first["test"]["accuracy"] > 0.5 and 0 < first["test"]["relmac"] < 1.5
    resumed = loop.train(ml_collections.ConfigDict(config.to_dict()), str(tmp_path / "a"),
                             progress=False)
    assert resumed["test"] == first["test"]


def test_classify_feeds_each_step_its_own_batch(tmp_path):
    """the loop's classifier step s trains on tabular.batches(seed, s): its final params equal
    hand-made steps on batches 0..2, and differ from three steps on batch 0."""
    config = mlp_common.base("dgate", "mnist5k")
    config.model.update(hidden=(16,))
    config.gate.update(warmup_steps=1, anneal_steps=2, ramp_steps=2)
    config.train.update(steps=3, batch_size=32, warmup_steps=1, ckpt_every=3, eval_every=100,
                        log_every=3)
    config.eval.batch_size = 512
    loop.train(config, str(tmp_path), progress=False)
    trained = rundir.load(str(tmp_path)).params

    config = classify.resolve_config(config)
    (x, y) = rundir.load_classifier_data(config.data)["train"]
    model = rundir.model_of(config)
    tx = classify.make_tx(config)
    step_fn = classify.make_train_step(config, model, tx)

    def params_after(steps):
        state = classify.init_state(model, tx, jax.random.key(config.seed))
        for s in steps:
            state, _ = step_fn(state, *tabular.batches(x, y, 32, config.seed, s))
        return state["params"]

    chex.assert_trees_all_equal(params_after([0, 1, 2]), trained)
    with pytest.raises(AssertionError):
        chex.assert_trees_all_close(params_after([0, 0, 0]), trained, rtol=1e-4, atol=1e-6)
