"""The named structural pieces the ``llm`` family composes (docs/hf.md, "plug-in layout").

Each module holds one kind of piece and a table of its named choices, written once:

- :mod:`.rotary`: rotary position embeddings (``Config.rope_type``: default, linear,
  llama3, yarn; ``partial_rotary_factor``; ``rope_interleave``);
- :mod:`.attention`: token mixers (``Config.attention``: ``ATTENTION``);
- :mod:`.routers`: how an MoE layer picks and weighs its experts (``Config.router``:
  ``ROUTERS``);
- :mod:`.experts`: the expert MLPs and their dispatch (``Config.experts``: ``EXPERTS``);
- :mod:`.hyper`: manifold-constrained hyper-connections (DeepSeek-V4's mHC residual streams,
  pre/post/comb coefficient sites);
- :mod:`.indexer`: the lightning indexer of DeepSeek Sparse Attention (V3.2, GLM-5) and the
  causal top-k selection its scores drive (shared with DeepSeek-V4's compressed indexer).

An architecture port (``dynjax.loaders.archs``) names its choices in the config it
returns; :mod:`dynjax.models.llm` looks each one up in its table and never branches on a
model_type.
"""
