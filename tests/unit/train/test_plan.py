"""The memory plan (dynjax.train.memory_plan) against XLA's memory analysis of the compiled train step:
the state it counts is exactly the step's arguments, and its activation estimate brackets
the step's temporaries (close without remat, an upper bound with it). The per-device split
over a real 8-device mesh is checked in tests/integration/parallel/test_multidevice.py."""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from dynjax.train import memory_plan as plan
from dynjax.models import build
from dynjax.parallel import sharding
from dynjax.train import lm
from tests.conftest import tiny_config

ONE = {"data": 1, "fsdp": 1, "tensor": 1}


def test_per_device_bytes_split_like_named_sharding():
    """The plan's shard arithmetic equals NamedSharding's shard shapes on a (2, 4, 2) mesh."""
    c = tiny_config("feature_gate")
    model = build(c.model.to_dict())
    params = jax.eval_shape(lambda: lm.init_state(c, model, jax.random.key(0)))["params"]
    specs = model.logical_axes(jnp.zeros((1, c.data.seq_len), jnp.int32))
    sizes = {"data": 2, "fsdp": 4, "tensor": 2}
    mesh = jax.sharding.AbstractMesh(tuple(sizes.values()), tuple(sizes))
    for preset in ("fsdp", "fsdp_tp"):
        rules = sharding.PRESETS[preset]
        mesh_specs = jax.tree.leaves(nn.logical_to_mesh(specs, rules),
                                     is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))
        want = sum(x.dtype.itemsize * math.prod(
            jax.sharding.NamedSharding(mesh, s).shard_shape(x.shape))
            for x, s in zip(jax.tree.leaves(params), mesh_specs))
        got = plan.per_device_bytes(params, specs, sizes, rules)
        assert got == want < plan.tree_bytes(params)


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match="--mesh="):
        plan.parse_mesh("data=8,pipeline=2")
    with pytest.raises(ValueError, match="--device-memory="):
        plan.parse_bytes("16 parsecs")
    assert plan.parse_bytes("16GiB") == 16 * 2 ** 30 and plan.parse_bytes("80GB") == 80e9
    c = tiny_config("feature_gate")
    with pytest.raises(ValueError, match="train.batch_size=8 is not divisible by the 16"):
        plan.plan(c, {"data": 4, "fsdp": 4, "tensor": 1}, sharding.PRESETS["fsdp"])


def test_fsdp_ep_splits_the_heads_axis_where_no_embedding_axis_takes_fsdp():
    """DeepSeek-V4-Flash on (data 1, fsdp 32, tensor 8) under ``fsdp_ep``: the low-rank
    query, the grouped output projection and the indexer's query split their heads axis
    over fsdp (they have no embedding axis), so a device holds about a 256th of the
    parameters; a parameter that has an embedding axis keeps its heads whole."""
    from jax.sharding import PartitionSpec as P

    from dynjax.loaders import hf
    from dynjax.loaders.hf_architectures import PUBLISHED_FIELDS
    from dynjax.models import deepseek_v4 as v4
    from dynjax.models.components import table

    cfg = hf.config_from_hf(PUBLISHED_FIELDS["deepseek-ai/DeepSeek-V4-Flash-Base"], "bfloat16")
    params = table.tree(v4.param_table(cfg), lambda path, shape: jax.ShapeDtypeStruct(
        shape, jnp.dtype(v4.param_dtype(cfg, path))))
    specs, rules = v4.logical_axes(cfg), sharding.PRESETS["fsdp_ep"]
    got = plan.per_device_bytes(params, specs, {"data": 1, "fsdp": 32, "tensor": 8}, rules)
    assert got < 1.25 * plan.tree_bytes(params) / 256      # 2.45 GiB; 7.96 with heads whole
    csa = cfg.layer_types.index("compressed_sparse_attention")
    attn = nn.logical_to_mesh(specs, rules)["layers"][csa]["attn"]
    assert attn["q_b"] == P(None, "fsdp") and attn["o_a"] == P(None, "fsdp", None)
    assert attn["compressor"]["indexer"]["q_b"] == P(None, "fsdp")
    assert nn.logical_to_mesh_axes(("embed", "heads", "kv"), rules) == P("fsdp", None, None)
