"""Gemma-4's text model saved alone (Gemma4ForCausalLM's config.json, ``model_type``
gemma4_text, tensors under ``model.``): ``archs.gemma4``'s port without the wrapper."""
from dynjax.loaders.archs import Arch
from dynjax.loaders.archs.gemma4 import TENSORS, config

ARCH = Arch("gemma4_text", config, TENSORS)
