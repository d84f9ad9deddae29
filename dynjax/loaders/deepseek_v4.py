"""DeepSeek-V4 checkpoint directories -> (:class:`dynjax.models.deepseek_v4.DeepseekV4`, params).

V4 is its own model (hyper-connection streams, compressed attention), not an ``llm.Config``,
so its architecture plug-in (``dynjax/loaders/archs/deepseek_v4.py``) names :data:`PORT`:
``dynjax.loaders.hf.load`` (and every program over it) reads V4 through the same
safetensors reader as every port (:class:`dynjax.loaders.tensors.Tensors`: FP8 and FP4
dequantised, multi-token-prediction tensors skipped, each leaf placed on its devices as its
layer is built).
"""
from __future__ import annotations

import jax.numpy as jnp

from dynjax.errors import CheckpointError, ConfigError
from dynjax.loaders import tensors as tensors_lib
from dynjax.models import deepseek_v4 as v4

# transformers' save_pretrained keeps these of its own names (and a "model." prefix, which
# PREFIXES drops)
SAVED_AS = {"embed.weight": "embed_tokens.weight", "hc_head_fn": "hc_head.hc_fn",
            "hc_head_base": "hc_head.hc_base", "hc_head_scale": "hc_head.hc_scale"}
tensors_lib.PREFIXES["deepseek_v4"] = {"model.": ""}


class Port:
    """The three steps ``dynjax.loaders.hf`` takes for every architecture, for V4."""

    @staticmethod
    def config(arch, hf, dtype) -> v4.Config:
        tensors_lib.check_quantization(hf)
        try:
            return v4.config_from_hf({**arch.defaults, **hf}, dtype)
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(f"config.json describes no valid deepseek_v4 model ({e}); use "
                              "the checkpoint's own config.json") from None

    @staticmethod
    def build(cfg: v4.Config) -> v4.DeepseekV4:
        return v4.DeepseekV4(cfg)

    @staticmethod
    def params(cfg: v4.Config, t: tensors_lib.Tensors, strict: bool = True, shardings=None):
        def get(name):
            for n in (name, SAVED_AS.get(name)):
                if n in t:
                    return t.get(n, integer=n.endswith("tid2eid"))
            raise CheckpointError(f"checkpoint lacks tensor {name!r}; the safetensors files "
                                  "are incomplete or config.json describes another model")

        shapes = {path: shape for path, shape, _ in v4.param_table(cfg)}

        def place(path, a):
            if path not in shapes or tuple(a.shape) != tuple(shapes[path]):
                raise CheckpointError(f"parameter {'/'.join(map(str, path))} reads shape "
                                      f"{tuple(a.shape)} but config.json implies "
                                      f"{shapes.get(path)}; use the checkpoint's own config.json")
            sharding = shardings
            for key in path if shardings is not None else ():
                sharding = sharding[key]
            return tensors_lib.place(a, jnp.dtype(v4.param_dtype(cfg, path)), sharding)
        params = v4.params_from_tensors(cfg, get, place)
        if strict:
            tensors_lib.refuse_unused(t, cfg)
        return params


PORT = Port()


def load(path: str, dtype=jnp.float32):
    """(DeepseekV4 model, params) of a local checkpoint directory: ``dynjax.loaders.hf.load``."""
    from dynjax.loaders import hf
    return hf.load(path, dtype)
