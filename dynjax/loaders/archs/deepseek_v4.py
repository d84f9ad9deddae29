"""DeepSeek-V4 (V4-Flash, V4-Pro): its own model (``dynjax.models.deepseek_v4``: mHC
residual streams, compressed and sparse attention, hash and learned routers), read by
``dynjax.loaders.deepseek_v4.PORT``; config.json fields default to transformers'."""
from dynjax.loaders.archs import Arch
from dynjax.loaders.deepseek_v4 import PORT

ARCH = Arch("deepseek_v4", config=None, port=PORT)
