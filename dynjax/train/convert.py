"""Converting one model's parameters into another's (``train.init_from``): a dense model
continued as Mixture-of-Depths, or its MLPs upcycled into MoE experts (Komatsuzaki et al.
2023). Source and target are read as one list of blocks (:func:`block_sites`); :func:`plan`
gives every target parameter an action (copy, upcycle, create) or one ConfigError;
:func:`convert` fills them, fitting MoD routers on the dense forward (:func:`fit_routers`).
Opening the source and recording it: :mod:`dynjax.train.init_from`. What is copied, created
and refused, and the router rule's reasons: docs/conversion.md.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from dynjax.errors import ConfigError
from dynjax.models import llm
from dynjax.models import mod as mod_lib
from dynjax.models.transformer import Block, Embed, window_positions

REFUSED = {"mudd": "its blocks read every earlier layer's output (cross-layer mixing)",
           "gated_mlp": "a classifier: no decoder blocks",
           "muddpythia": "a reference port with its own parameter names",
           "deepseek_v4": "its layers (compressed attention, mHC, hash routing) have no "
                          "block list here"}
CORE = ("vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "rope_base")
MLP_OF = {"wi": ("mlp", "up", "kernel"), "wo": ("mlp", "down", "kernel")}
LLM_MLP = ("gate", "up", "down")             # an llm expert stack (E, ...) <- mlp/<name>


# ------------------------------------------------------------------------ the block view

def _flat(params) -> dict:
    """``{path: leaf}`` in tree order, a path's parts dict keys and list indices (an llm
    model's layers are a list)."""
    return {tuple(getattr(k, "key", getattr(k, "idx", None)) for k in path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}


def block_sites(cfg, params) -> dict:
    """Every parameter of a model under a layout-free name.

    ``{(block, path): (real path, index)}``: ``block`` the depth index (None for the
    embedding and head), ``path`` the parameter's path inside the block (``attn/query/kernel``,
    ``mlp/up/kernel``, ``moe/wi``, ``router/proj/kernel``; llm: ``attn/q``, ``mlp/gate``,
    ``moe/experts/gate``), ``index`` the position along a scanned stack's leading axis (None
    when unrolled)."""
    return FAMILIES[cfg.family].sites(cfg, params)


def _llm_sites(cfg, params) -> dict:
    """One dict per layer already: layers[i] is block i."""
    return {(path[1], path[2:]) if path[0] == "layers" else (None, path): (path, None)
            for path in _flat(params)}


def _core_sites(cfg, params, sub_blocks: bool = False) -> dict:
    """The core's layer stacks (scanned or unrolled); ``sub_blocks``: a layer unit holds
    several blocks (MoD's ``sub_0``, ``sub_1``, ...)."""
    per_unit = len(mod_lib.layout(cfg)[1]) if sub_blocks else 1
    out = {}
    for path, leaf in _flat(params).items():
        if path[0] != "layers":
            out[(None, path)] = (path, None)
            continue
        if cfg.scan_layers:
            units = [(u, path[1:], u) for u in range(leaf.shape[0])]
        else:
            units = [(int(path[1].removeprefix("layer_")), path[2:], None)]
        for u, rest, index in units:
            j = 0
            if sub_blocks:
                j, rest = int(rest[0].removeprefix("sub_")), rest[1:]
            if rest[0] == "block":          # gates, mod: the core Block's own parameters
                rest = rest[1:]
            out[(u * per_unit + j, rest)] = (path, index)
    return out


def _values(cfg, params) -> dict:
    """``{(block, path): array}`` of ``block_sites``, as host arrays."""
    flat = _flat(jax.device_get(params))
    return {key: np.asarray(flat[path] if i is None else flat[path][i])
            for key, (path, i) in block_sites(cfg, params).items()}


def _name(key) -> str:
    block, path = key
    return "/".join(path) if block is None else f"block {block} {'/'.join(path)}"


def created(path: tuple) -> bool:
    """Parameters a conversion creates when the source has no twin of that shape."""
    return path[0] in ("router", "predictor") or path[:2] == ("moe", "router")


def upcycled_from(cfg, path: tuple):
    """``(which matrix, the block's dense MLP path)`` an expert stack is copied from, or None:
    core ``moe/wi`` <- ``mlp/up/kernel``, ``moe/wo`` <- ``mlp/down/kernel``; llm
    ``moe/experts/NAME`` <- ``mlp/NAME`` (gate, up, down of the SwiGLU)."""
    return FAMILIES[cfg.family].upcycled_from(path)


def _llm_upcycled(path: tuple):
    if path[:2] == ("moe", "experts") and path[2] in LLM_MLP:
        return LLM_MLP.index(path[2]), ("mlp", path[2])
    return None


def _core_upcycled(path: tuple):
    if path[0] == "moe" and path[-1] in MLP_OF:
        return list(MLP_OF).index(path[-1]), MLP_OF[path[-1]]
    return None


def architecture(cfg) -> tuple:
    """The config fields a conversion keeps: they must equal the source's."""
    return FAMILIES[cfg.family].architecture


# ------------------------------------------------------------------------ the router rule

def dense_steps(cfg, values: dict, seq_len: int, batch_size: int):
    """A dense model's forward, one block at a time, from its ``_values``: ``(embed, blocks)``
    with ``embed(tokens) -> h`` and ``blocks[b](h) -> F_b(h)``, the block's whole update
    (attention then MLP), jitted for (batch_size, seq_len) windows."""
    trees = [traverse_util.unflatten_dict({p: v for (b, p), v in values.items() if b == i})
             for i in range(cfg.n_layers)]
    table, embed, update = FAMILIES[cfg.family].dense_forward(cfg, values, seq_len, batch_size)
    update = jax.jit(update)    # parameters are arguments: never constants of the program
    return (functools.partial(jax.jit(embed), table),
            [functools.partial(update, tree) for tree in trees])


def _llm_forward(cfg, values: dict, seq_len: int, batch_size: int):
    """(embedding table, embed(table, tokens), update(block params, h)) of an llm model."""
    positions = llm.positions_at(cfg, jnp.broadcast_to(jnp.arange(seq_len),
                                                       (batch_size, seq_len)))

    def embed(e, t):
        return jnp.take(e, t, axis=0).astype(cfg.compute_dtype)

    def update(p, h):
        a, m, _, _ = llm.attention_then_ffn(cfg, p, h, positions, None)
        return a + m
    return values[(None, ("embed",))], embed, update


def _core_forward(cfg, values: dict, seq_len: int, batch_size: int):
    """The same for the core's decoder blocks."""
    positions = window_positions(cfg, batch_size, seq_len)

    def embed(e, t):
        return Embed(cfg).apply({"params": e}, t)

    def update(p, h):
        return Block(cfg).apply({"params": p}, h, positions)[0]
    return {"embedding": values[(None, ("embed", "embedding"))]}, embed, update


@dataclasses.dataclass(frozen=True)
class BlockView:
    """How conversion reads one family's parameters as a list of blocks."""
    sites: Callable          # (cfg, params) -> block_sites
    upcycled_from: Callable  # block path -> (which matrix, dense MLP path) | None
    architecture: tuple      # config fields that must equal the source's
    dense_forward: Callable  # (cfg, values, seq_len, batch) -> (table, embed, update)
    hf: bool = False         # Hugging Face layouts (llm): convert among themselves only


_CORE = BlockView(_core_sites, _core_upcycled, CORE, _core_forward)
FAMILIES = {   # the families a block list reads (others: REFUSED)
    "gates": _CORE,
    "mod": dataclasses.replace(_CORE, sites=functools.partial(_core_sites, sub_blocks=True)),
    "moe": _CORE,
    "llm": BlockView(_llm_sites, _llm_upcycled, llm.ARCHITECTURE, _llm_forward, hf=True)}


def dense_trace(embed, blocks: list, windows: np.ndarray, batch_size: int = 16):
    """Each block's input h and update F(h) along a dense model's forward over ``windows``:
    two lists (one per block) of (N, T, d) float32 host arrays. ``embed``, ``blocks``: the
    forward's steps (``dense_steps``, compiled for ``batch_size`` windows)."""
    hs, us = [[] for _ in blocks], [[] for _ in blocks]
    for lo in range(0, len(windows), batch_size):
        chunk = windows[lo:lo + batch_size]
        pad = batch_size - len(chunk)
        tokens = np.concatenate([chunk, np.zeros((pad, chunk.shape[1]), chunk.dtype)])
        h = embed(tokens)
        for b, block in enumerate(blocks):
            u = block(h)
            hs[b].append(np.asarray(h)[:len(chunk)])
            us[b].append(np.asarray(u)[:len(chunk)])
            h = h + u
    return [np.concatenate(x) for x in hs], [np.concatenate(x) for x in us]


def router_target(update: np.ndarray, capacity: float, gain: float) -> np.ndarray:
    """z = gain * (log||F(h)|| - q_{1-c}) / std(log||F(h)||) per token, (N, T): a fraction
    c of the tokens (those with the largest updates) score above 0."""
    s = np.log(np.linalg.norm(update.astype(np.float64), axis=-1) + 1e-12)
    return gain * (s - np.quantile(s, 1.0 - capacity)) / max(float(s.std()), 1e-12)


def ridge(x: np.ndarray, z: np.ndarray, rel: float = 1e-4) -> np.ndarray:
    """argmin_w ||x w - z||^2 + lam ||w||^2, lam = rel * trace(x'x) / dim (float64)."""
    x, z = x.astype(np.float64), z.astype(np.float64)
    gram = x.T @ x
    lam = rel * np.trace(gram) / gram.shape[0]
    return np.linalg.solve(gram + lam * np.eye(gram.shape[0]), x.T @ z)


def fit_routers(cfg, mod_blocks, hs, us, init: dict, gain: float) -> tuple[dict, dict]:
    """The MoD rule: per MoD block b, the router r = w.h fitted by ridge least squares to
    ``router_target`` on the dense forward's (h_b, F_b(h_b)); the predictor keeps its
    seeded hidden layer, its output layer (weights and bias) is fitted to the same target.

    ``init``: the target's seeded values ``{(b, path): array}`` (the predictor's hidden
    layer). Returns (``{(b, path): fitted array}``, a fit report per block)."""
    fitted, report = {}, {}
    k = mod_lib.capacity(cfg, hs[0].shape[1]) if mod_blocks else 0
    for b in mod_blocks:
        h, z = hs[b].reshape(-1, hs[b].shape[-1]), router_target(us[b], cfg.mod.capacity, gain)
        w = ridge(h, z.reshape(-1))
        fitted[(b, ("router", "proj", "kernel"))] = w[:, None].astype(np.float32)
        hid = init[(b, ("predictor", "hidden", "kernel"))], init[(b, ("predictor", "hidden", "bias"))]
        feats = np.asarray(nn.gelu(jnp.asarray(h @ hid[0] + hid[1])), np.float64)
        v = ridge(np.concatenate([feats, np.ones((len(feats), 1))], axis=1), z.reshape(-1))
        fitted[(b, ("predictor", "out", "kernel"))] = v[:-1, None].astype(np.float32)
        fitted[(b, ("predictor", "out", "bias"))] = v[-1:].astype(np.float32)
        r = (h @ w).reshape(z.shape)
        fit_top = np.argsort(-r, axis=1)[:, :k]
        true_top = np.argsort(-z, axis=1)[:, :k]
        overlap = np.mean([len(np.intersect1d(a, t)) / k for a, t in zip(fit_top, true_top)])
        report[str(b)] = {"router_r2": float(1 - np.var(r - z) / np.var(z)),
                          "topk_overlap": float(overlap), "router_asks": float(np.mean(r > 0)),
                          "predictor_asks": float(np.mean(feats @ v[:-1] + v[-1] > 0))}
    return fitted, report


# ------------------------------------------------------------------------ the conversion

def _shapes(cfg, params) -> dict:
    """``{(block, path): shape}`` of ``block_sites`` (arrays or ShapeDtypeStructs)."""
    flat = _flat(params)
    return {key: tuple(flat[path].shape)[0 if i is None else 1:]
            for key, (path, i) in block_sites(cfg, params).items()}


def plan(src_cfg, src_params, cfg, params) -> dict:
    """How each target parameter is made: ``{(block, path): "copy" | "upcycle" | "create"}``.
    Works on shapes alone (arrays or ShapeDtypeStructs), so a run checks it before writing
    its directory. Raises ConfigError listing every parameter it cannot make."""
    for c, what in ((src_cfg, "source"), (cfg, "target")):
        if getattr(c, "family", None) not in FAMILIES:
            raise ConfigError(f"train.init_from converts among the {', '.join(FAMILIES)} "
                              f"families; the {what} is {getattr(c, 'family', type(c).__name__)!r}")
    if FAMILIES[src_cfg.family].hf != FAMILIES[cfg.family].hf:
        source = (f"{src_cfg.family}/{src_cfg.model_type}" if FAMILIES[src_cfg.family].hf
                  else src_cfg.family)
        raise ConfigError(f"train.init_from: the source ({source}) cannot become a {cfg.family} "
                          "model: Hugging Face ports (and llm runs) convert into the llm family "
                          "(configs/llm_convert.py:moe|mod|dense), the byte-level core families "
                          "(gates, mod, moe) among themselves")
    core = [f"model.{f}: source {getattr(src_cfg, f)!r}, target {getattr(cfg, f)!r}"
            for f in architecture(cfg) if getattr(src_cfg, f) != getattr(cfg, f)]
    if core:
        raise ConfigError("train.init_from: the source's core differs from the target's ("
                          + "; ".join(core) + "); set the target's model fields to the source's")
    src, target = _shapes(src_cfg, src_params), _shapes(cfg, params)
    merged = sorted({b for b, p in target if b is not None and p[0] == "mlp"
                     and any(c == b and q[0] == "moe" for c, q in src)})
    if merged:
        raise ConfigError(f"train.init_from: block(s) {merged} are MoE layers in the source "
                          f"({src_cfg.family}/{src_cfg.variant}) and dense MLPs in the target "
                          f"({cfg.family}/{cfg.variant}); experts do not merge back into one "
                          "MLP (there is no mapping): convert into a target with the same MoE "
                          "layers")
    actions, used, problems = {}, set(), []
    for key, shape in target.items():
        block, path = key
        origin = upcycled_from(cfg, path) if block is not None else None
        mlp = (block, origin[1]) if origin else None
        if src.get(key) == shape:
            actions[key] = "copy"
            used.add(key)
        elif mlp and mlp in src:
            if (shape[0],) + src[mlp] != shape:
                problems.append(f"{_name(key)} {shape} cannot hold copies of the source's "
                                f"{'/'.join(mlp[1])} {src[mlp]}")
            actions[key] = "upcycle"
            used.add(mlp)
        elif created(path):
            actions[key] = "create"
        elif key in src:
            problems.append(f"{_name(key)}: source {src[key]}, target {shape}")
        else:
            problems.append(f"{_name(key)}: not in the source")
    problems += [f"the source's {_name(k)} has no place in the target"
                 for k in sorted(set(src) - used, key=_name)]
    if problems:
        shown = "; ".join(problems[:6]) + (f"; {len(problems) - 6} more" if len(problems) > 6 else "")
        raise ConfigError(f"train.init_from cannot convert a {src_cfg.family}/{src_cfg.variant} "
                          f"source into {cfg.family}/{cfg.variant}: {shown}; use a source of the "
                          "same size whose extra parts the conversion creates (routers, "
                          "predictors, experts from the MLP)")
    routers = [b for (b, p), a in actions.items() if a == "create" and p[0] == "router"]
    if routers and not (src_cfg.variant == "dense" and src_cfg.family != "moe"):
        raise ConfigError("a MoD router is fitted on a dense source's forward: train.init_from "
                          f"must be a dense run (got {src_cfg.family}/{src_cfg.variant})")
    return actions


def convert(src_cfg, src_params, cfg, params, *, windows=None, gain: float = 2.0,
            noise: float = 0.0, seed: int = 0) -> tuple[dict, dict]:
    """The target ``params`` (its seeded init, giving shapes and the new routers' seeds)
    filled from the source's as ``plan`` says: ``(params, report)``. ``windows``: calibration
    token windows for the MoD router fit (needed when a MoD router is created)."""
    actions = plan(src_cfg, src_params, cfg, params)
    src, init = _values(src_cfg, src_params), _values(cfg, params)
    out, kinds = {}, set()
    for key, action in actions.items():
        block, path = key
        if action == "copy":
            out[key] = src[key]
        elif action == "upcycle":
            which, mlp_path = upcycled_from(cfg, path)
            mlp = src[(block, mlp_path)]
            rng = np.random.default_rng([seed, block, which])
            out[key] = (np.broadcast_to(mlp, init[key].shape) + noise * float(mlp.std())
                        * rng.standard_normal(init[key].shape)).astype(init[key].dtype)
            kinds.add("moe_upcycle")
        else:
            out[key] = init[key]                   # MoD routers: refitted below
            if path[0] in ("router", "predictor"):
                kinds.add("mod")
    report = {"conversion": "+".join(sorted(kinds)) or "copy"}
    mod_blocks = sorted({b for (b, p), a in actions.items() if a == "create" and p[0] == "router"})
    if mod_blocks:
        if windows is None:
            raise ValueError("a MoD router fit needs calibration windows")
        hs, us = dense_trace(*dense_steps(src_cfg, src, windows.shape[1], 16), windows, 16)
        fitted, report["routers"] = fit_routers(cfg, mod_blocks, hs, us, init, gain)
        out.update(fitted)
        report.update(router_rule="ridge fit to log update norm", router_gain=gain,
                      calibration_windows=int(len(windows)))
    return _assemble(cfg, params, out), report


def _assemble(cfg, params, values: dict):
    """``params``' tree with every site replaced by ``values[site]``."""
    params = jax.device_get(params)
    flat = {path: np.array(leaf) for path, leaf in _flat(params).items()}
    for key, (path, i) in block_sites(cfg, params).items():
        if i is None:
            flat[path] = np.asarray(values[key], flat[path].dtype)
        else:
            flat[path][i] = values[key]
    return jax.tree_util.tree_structure(params).unflatten(list(flat.values()))
