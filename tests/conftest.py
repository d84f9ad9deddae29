"""Shared tiny configs. Everything is float32 on CPU unless a test is about bfloat16."""
import os
import sys

import pytest

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


@pytest.fixture
def make_config():
    return tiny_config
