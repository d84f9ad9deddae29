"""DeepSeek-V4 checkpoint directories -> (:class:`dynjax.models.deepseek_v4.DeepseekV4`, params).

V4 is its own model (hyper-connection streams, compressed attention), not an ``llm.Config``,
so it has its own reader over the shared safetensors reader (:mod:`dynjax.loaders.tensors`).
"""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from dynjax.errors import CheckpointError
from dynjax.loaders import tensors as tensors_lib
from dynjax.models import deepseek_v4 as v4


# transformers' save_pretrained keeps these of its own names (and a "model." prefix)
SAVED_AS = {"embed.weight": "embed_tokens.weight", "hc_head_fn": "hc_head.hc_fn",
            "hc_head_base": "hc_head.hc_base", "hc_head_scale": "hc_head.hc_scale"}


def load(path: str, dtype=jnp.float32):
    """(DeepseekV4 model, params) of a local checkpoint directory (config.json and one or
    more ``*.safetensors`` files)."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise CheckpointError(f"{path} has no config.json; pass a checkpoint directory")
    with open(cfg_path) as f:
        cfg = v4.config_from_hf(json.load(f))
    files = [tensors_lib.SafetensorsFile(os.path.join(path, n))
             for n in sorted(os.listdir(path)) if n.endswith(".safetensors")]
    where = {k: f for f in files for k in f.keys()}

    def get(name):
        found = [n for n in (name, "model." + name, "model." + SAVED_AS.get(name, name))
                 if n in where]
        if not found:
            raise CheckpointError(f"{path}: tensor {name!r} is missing; is this a complete "
                                  "deepseek_v4 checkpoint?")
        a = where[found[0]].read(found[0])
        return a if a.dtype.kind in "iu" else a.astype(np.float32)
    params = v4.params_from_tensors(cfg, get)
    params = jax.tree.map(lambda a: jnp.asarray(a) if a.dtype.kind in "iu"
                          else jnp.asarray(a, dtype), params)
    return v4.DeepseekV4(cfg), params
