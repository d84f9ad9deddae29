"""Hugging Face architectures as plug-ins: one module per ``model_type``.

A module here defines ``ARCH``, an :class:`Arch`: the ``model_type`` it ports,
transformers' ``defaults`` for fields config.json may omit, ``config(hf)`` (the
``llm.Config`` fields, or a one-line refusal), the ``tensors`` names, and a ``port`` for an
architecture with its own model (DeepSeek-V4). Every module that defines ``ARCH`` is
registered when the package is imported: adding an architecture is adding its module.
Depth: docs/hf.md#the-arch-record-dynjaxloadersarchs__init__py
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
