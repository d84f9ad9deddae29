"""Hugging Face architectures as plug-ins: one module per ``model_type``.

A module here (``llama.py``, ``qwen2_moe.py``, ...) defines ``ARCH``, an :class:`Arch`:

- ``model_type``: config.json's ``model_type`` it ports (the module's name);
- ``defaults``: transformers' own configuration defaults for the fields config.json may
  omit (``rms_norm_eps``, ``rope_theta``, ``head_dim``, ...), filled in before ``config``
  reads the file, so a missing field means what it means in transformers;
- ``config(hf) -> dict``: the ``dynjax.models.llm.Config`` fields, naming the shared
  components it composes (``attention``, ``router``, ``experts``, ``rope_type``, ...) and
  refusing in one line a setting it does not compute;
- ``tensors``: params path -> checkpoint tensor name (:mod:`.common`'s tables, extended or
  overridden);
- ``port``: None for an ``llm.Config`` model (every port so far but one); an architecture
  whose layer ``llm.Config`` cannot describe (DeepSeek-V4's hyper-connection streams) names
  its own model here: an object with ``config(hf, dtype) -> cfg``, ``build(cfg) -> model``
  and ``params(cfg, tensors, strict, shardings) -> params`` (``dynjax.loaders.hf`` calls
  the same three for every architecture, the ``llm`` one by default).

Every module in this package that defines ``ARCH`` is registered by its model_type when
the package is imported: adding an architecture is adding its module (docs/hf.md).
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Callable, Mapping

from dynjax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Arch:
    model_type: str
    config: Callable[[Mapping], dict] | None
    tensors: Mapping = dataclasses.field(default_factory=dict)
    defaults: Mapping = dataclasses.field(default_factory=dict)
    port: object = None


def _discover() -> dict:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        arch = getattr(module, "ARCH", None)
        if arch is not None:
            if arch.model_type != info.name:
                raise RuntimeError(f"{module.__name__} ports {arch.model_type!r}; name the "
                                   "module after its model_type")
            found[arch.model_type] = arch
    return dict(sorted(found.items()))


ARCHS: dict = _discover()
SUPPORTED = tuple(ARCHS)


def get(model_type) -> Arch:
    """The port of ``model_type``; one-line ConfigError naming the supported ones."""
    if model_type not in ARCHS:
        raise ConfigError(f"config.json model_type={model_type!r} is not supported; "
                          f"supported: {', '.join(SUPPORTED)}")
    return ARCHS[model_type]
