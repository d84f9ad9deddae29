"""The memory plan against XLA's compiled train step (tests/unit/train/test_plan.py holds the
plan's arithmetic): parameters, optimizer state and activations within the plan's bounds."""
import jax
import jax.numpy as jnp
import pytest

from dynjax.models import build
from dynjax.parallel import sharding
from dynjax.train import lm
from dynjax.train import memory_plan as plan
from tests.conftest import tiny_config
from tests.unit.train.test_plan import ONE


def _compiled(c):
    model = build(c.model.to_dict())
    abstract = jax.eval_shape(lambda: lm.init_state(c, model, jax.random.key(0)))
    tokens = jax.ShapeDtypeStruct((c.train.batch_size, c.data.seq_len), jnp.int32)
    step = jax.jit(lm.make_train_step(model, lm.make_optimizer(c.train)))
    return step.lower(abstract, tokens).compile().memory_analysis(), tokens


@pytest.mark.parametrize("remat", [False, True])
def test_plan_matches_compiled_memory(remat):
    c = tiny_config("feature_gate", remat=remat)
    p = plan.plan(c, ONE, sharding.PRESETS["dp"])
    mem, tokens = _compiled(c)
    batch_bytes = tokens.size * 4
    step_bytes = 4  # the int32 step counter
    assert p["params"] + p["optimizer"] + step_bytes + batch_bytes == mem.argument_size_in_bytes
    measured = p["params"] + p["optimizer"] + mem.temp_size_in_bytes
    if remat:  # the recomputed layer's peak is an upper bound
        assert measured <= p["total"] <= 2.5 * measured
    else:
        assert 0.85 * measured <= p["total"] <= 1.15 * measured
    assert p["activations_remat"] < p["activations_no_remat"]
