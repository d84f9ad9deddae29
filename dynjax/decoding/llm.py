"""KV-cache decoding of the ``llm`` family (Hugging Face ports, ``dynjax.models.llm``).

The family's own functions run on a chunk of new tokens (one token a step, or a whole
prompt) against the cache: the same projections, norms, rotary angles and FFN (every MoE
token reaches its k experts, as in the sequence form: nothing depends on other tokens), so
decoding equals the forward at every position within float tolerance. A layer's cache
holds the keys and values of the ``n_kv_heads`` key/value heads only (grouped-query
attention shares them; multi-head latent attention: every head's expanded key and value,
not the latent), at the core cache's slots and positions (``decoding.cache``).
"""
from __future__ import annotations

import jax.numpy as jnp

from dynjax.decoding.cache import append_slots, write
from dynjax.models import llm
from dynjax.models.components.attention import ATTENTION
from dynjax.models.mod import EMPTY


def init_cache(cfg: llm.Config, batch: int, max_len: int):
    """Per layer: ``max_len`` slots of keys and values, as ``cfg.attention`` caches them
    (GQA: (n_kv_heads, head_dim) each)."""
    if cfg.mod_layers:
        raise NotImplementedError(
            f"KV-cache decoding of the llm family's Mixture-of-Depths layers "
            f"(mod_layers={cfg.mod_layers}) is not built; its causal rules are scored by the "
            "sequence forward (model.mod_route='router' or 'predictor'), as train.py evaluates")
    if cfg.index_topk:
        raise NotImplementedError(
            f"KV-cache decoding of DeepSeek Sparse Attention (index_topk={cfg.index_topk}) is "
            "not built (the cache would need the indexer's keys); decode by re-running the "
            "forward, which is causal")
    k_shape, v_shape = ATTENTION[cfg.attention].cache_shape(cfg)
    k = jnp.zeros((batch, max_len, *k_shape), cfg.compute_dtype)
    v = jnp.zeros((batch, max_len, *v_shape), cfg.compute_dtype)
    return [{"k": k, "v": v, "pos": jnp.full((batch, max_len), EMPTY, jnp.int32),
             "n": jnp.zeros((batch,), jnp.int32)} for _ in range(cfg.n_layers)]


def positions(cfg: llm.Config, index):
    return llm.positions_at(cfg, index)


def chunk(cfg: llm.Config, params, cache, tokens, pos, branch):
    """tokens (B, n) at ``pos`` -> logits (B, n, V), the new cache, info (none)."""
    del branch
    eps = cfg.rms_norm_eps
    h = jnp.take(params["embed"], tokens, axis=0).astype(cfg.compute_dtype)
    new_cache = []
    for i, (p, c) in enumerate(zip(params["layers"], cache)):
        q, k, v = llm.project_qkv(cfg, p["attn"], llm.rms_norm(h, p["input_norm"], eps), pos)
        c = write(c, append_slots(c, jnp.ones(tokens.shape, bool)), k, v, pos.index)
        h = h + llm.attend(llm.layer_config(cfg, i), p["attn"], q, c["k"], c["v"], pos.index,
                           c["pos"])
        x = llm.rms_norm(h, p["post_norm"], eps)
        h = h + (llm.moe_ffn(cfg, p["moe"], x, None)[0] if "moe" in p
                 else llm.swiglu(p["mlp"], x, cfg.compute_dtype))
        new_cache.append(c)
    logits = llm.head(cfg, params, llm.rms_norm(h, params["final_norm"], eps))
    return logits, new_cache, {}
