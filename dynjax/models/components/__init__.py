"""The named structural pieces the ``llm`` family composes: rotary embeddings, attention,
routers, experts, hyper-connections and the sparse-attention indexer, each a module with a
table of its named choices, written once. An architecture port (``dynjax.loaders.archs``)
names its choices in the config it returns; :mod:`dynjax.models.llm` looks each one up in
its table and never branches on a model_type.
Depth: docs/hf.md#the-components-dynjaxmodelscomponents
"""
