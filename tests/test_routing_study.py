"""The routing study's configs and plan (configs/routing_study.py, experiments/routing_study.py):
the arms have equal active parameters at the FCA sweep's tiny size, the arms that wait for a
component are refused naming it, and the plan puts each seed's analyses after its training
and skips what a seed's results file already holds."""
import dataclasses
import json

import pytest

from dynjax.configs import routing_study
from dynjax.models import build, llm
from experiments import fca_sweep
from experiments import routing_study as study


def test_arms_are_the_sweeps_tiny_size_with_the_dense_width_active():
    c = routing_study.get_config("softmax_topk")
    assert (c.model.n_layers, c.model.hidden_size, c.data.seq_len, c.train.batch_size) == \
        (4, 128, fca_sweep.SEQ_LEN, fca_sweep.BATCH)
    assert c.data.source == fca_sweep.DATA_SOURCE
    cfg = build(c.model.to_dict()).cfg
    dense = dataclasses.replace(cfg, moe_layers=(), num_experts=0, top_k=0,
                                moe_intermediate_size=0)
    assert llm.param_count(cfg)["active"] == llm.param_count(dense)["active"] + \
        4 * 128 * 8   # the routers are the only extra active parameters


@pytest.mark.parametrize("arm", sorted(routing_study.NOT_YET))
def test_arms_not_trainable_yet_are_refused_naming_what_is_missing(arm):
    with pytest.raises(ValueError, match="not trainable yet: missing"):
        routing_study.get_config(arm)


def test_the_plan_orders_each_seeds_work_and_skips_what_is_done(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    items = study.work(runs, out, seeds=(0,))
    assert items == [("train", "softmax_topk", 0), ("audit", "softmax_topk", 0),
                     ("layers", "softmax_topk", 0), ("experts", "softmax_topk", 0)]
    f = study.seed_file(out, "softmax_topk", 0)
    f.parent.mkdir(parents=True)
    f.write_text(json.dumps({"audit": {}, "layers": {}}))
    assert study.work(runs, out, seeds=(0,)) == [("experts", "softmax_topk", 0)]
