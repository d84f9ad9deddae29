"""KV-cache decoding of the ``llm`` family (Hugging Face ports, ``dynjax.models.llm``).

The family's own functions run on a chunk of new tokens against the cache (the same
projections, norms, rotary angles and FFN), so decoding equals the forward at every
position within float tolerance. A layer caches the keys and values of its ``n_kv_heads``
heads (MLA: every head's expanded key and value) at the core cache's slots
(``decoding.cache``); a Gated DeltaNet layer its fixed-size state
(``components.deltanet.State``); a DeepSeek Sparse Attention layer also its indexer keys,
chosen from by the forward's ``indexer.select``. Details: docs/hf.md (Decoding).
"""
from __future__ import annotations

import jax.numpy as jnp

from dynjax.decoding import protocol
from dynjax.decoding.cache import append_slots, write
from dynjax.models import llm
from dynjax.models.components import deltanet, hyper
from dynjax.models.components.attention import ATTENTION
from dynjax.models.mod import EMPTY


def init_cache(cfg: llm.Config, batch: int, max_len: int):
    """Per layer: ``max_len`` slots of keys and values, as ``cfg.attention`` caches them
    (GQA: (n_kv_heads, head_dim) each) and, where the layer has a lightning indexer, its
    keys (``index_k``, index_head_dim each); a Gated DeltaNet layer's zero state."""
    if cfg.mod_layers:
        raise NotImplementedError(
            f"KV-cache decoding of the llm family's Mixture-of-Depths layers "
            f"(mod_layers={cfg.mod_layers}) is not built; its causal rules are scored by the "
            "sequence forward (model.mod_route='router' or 'predictor'), as train.py evaluates")

    def kv(i):   # each layer's own heads (llm.layer_config: Gemma-4's full layers)
        k_shape, v_shape = ATTENTION[cfg.attention].cache_shape(llm.layer_config(cfg, i))
        c = {"k": jnp.zeros((batch, max_len, *k_shape), cfg.compute_dtype),
             "v": jnp.zeros((batch, max_len, *v_shape), cfg.compute_dtype),
             "pos": jnp.full((batch, max_len), EMPTY, jnp.int32),
             "n": jnp.zeros((batch,), jnp.int32)}
        if cfg.index_topk and i not in cfg.index_shared:
            c["index_k"] = jnp.zeros((batch, max_len, cfg.index_head_dim), cfg.compute_dtype)
        return c
    state = deltanet.initial_state(cfg.deltanet, batch, cfg.compute_dtype) \
        if cfg.deltanet_layers else None
    return [state._asdict() if i in cfg.deltanet_layers else kv(i)
            for i in range(cfg.n_layers)]


def positions(cfg: llm.Config, index, bound=None):
    """The port's own rotary positions (its frequencies follow its config.json)."""
    del bound
    return llm.positions_at(cfg, index)


forward_config = protocol.same_config


def chunk(cfg: llm.Config, params, cache, tokens, pos, branch):
    """tokens (B, n) at ``pos`` -> logits (B, n, V), the new cache, info (none). Under
    ``residual`` "hyper" each block sits behind its hyper-connection, as in the forward."""
    del branch
    h = llm.embed(cfg, params, tokens)
    if cfg.residual == "hyper":
        h = hyper.expand_embeddings(cfg.hyper, h)
    new_cache = []
    index = {"chosen": None}   # the last indexing layer's selection (GLM-5's shared layers')
    for i, (p, c) in enumerate(zip(params["layers"], cache)):
        def mixer(z, c=c, i=i, p=p):
            x = llm.norm(cfg, z, p["input_norm"])
            if "deltanet" in p:
                a, _, state = llm.token_mixer(cfg, p, x, pos, None, deltanet.State(**c))
                return a, state._asdict()
            lc = llm.layer_config(cfg, i)
            q, k, v = llm.project_qkv(lc, p["attn"], x, llm.layer_positions(cfg, i, pos))
            slot = append_slots(c, jnp.ones(tokens.shape, bool))
            if cfg.index_topk:   # DeepSeek Sparse Attention over the cached slots
                more = {"index_k": llm.index_keys(lc, p["attn"], x, pos)} \
                    if "index_k" in c else {}
                c = write(c, slot, k, v, pos.index, **more)
                a, _, index["chosen"] = llm.sparse_attention(
                    lc, p["attn"], x, q, c["k"], c["v"], pos, (None, index["chosen"]),
                    (c.get("index_k"), c["pos"]))
                return a, c
            c = write(c, slot, k, v, pos.index)
            gate, _ = llm.output_gate(cfg, p["attn"], x, None)
            return llm.mixer_update(cfg, p, llm.attend(lc, p["attn"], q, c["k"], c["v"],
                                                       pos.index, c["pos"], gate)), c

        ffn = lambda z, p=p: llm.feed_forward(cfg, p, z, None, tokens)[0]
        if cfg.residual == "hyper":
            out = {}

            def block(z):
                a, out["cache"] = mixer(z)
                return a
            h, _ = hyper.around(cfg.hyper, p["attn_hc"], h, block, None)
            h, _ = hyper.around(cfg.hyper, p["ffn_hc"], h, ffn, None)
            c = out["cache"]
        else:
            a, c = mixer(h)
            h = h + a
            h = llm.layer_output(cfg, p, h + ffn(h))
        new_cache.append(c)
    if cfg.residual == "hyper":
        h, _ = hyper.head(cfg.hyper, params["hc_head"], h, None)
    logits = llm.head(cfg, params, llm.norm(cfg, h, params["final_norm"]))
    return logits, new_cache, {}
