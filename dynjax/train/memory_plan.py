"""Memory plan: what one device holds to train a config on a mesh, before anything runs
(the library of ``dynjax-plan`` / :mod:`dynjax.programs.plan`).

Per device: parameters, optimizer state and gradients (shapes from ``jax.eval_shape``, split
as the preset's logical axes say; nothing is allocated), the activations the backward pass
keeps (with and without remat) and the batch; then whether the total fits each common chip.
How activations are counted and what is an upper bound: docs/multihost.md.
"""
from __future__ import annotations

import math
import pathlib
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from dynjax.models import build
from dynjax.models.transformer import next_token_nll
from dynjax.parallel import sharding
from dynjax.train.lm import init_state, make_optimizer

GiB = 1024 ** 3
# device memory of common accelerators (HBM per chip)
CHIPS = {"v5e": 16 * GiB, "v4": 32 * GiB, "H100": 80 * GiB, "v5p": 95 * GiB,
         "H200": 141 * GiB}
_UNITS = {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
          "KIB": 1024, "MIB": 1024 ** 2, "GIB": GiB, "TIB": 1024 ** 4}


def parse_bytes(text: str) -> int:
    """'16GiB', '80GB', '1.5TiB' or a plain number of bytes."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"--device-memory={text!r}: give a size such as 16GiB or 80GB")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def parse_mesh(text: str) -> dict:
    """'data=8,fsdp=4' -> {'data': 8, 'fsdp': 4, 'tensor': 1}."""
    sizes = dict.fromkeys(sharding.AXES, 1)
    for part in filter(None, text.split(",")):
        name, _, size = part.partition("=")
        if name not in sizes or not size.isdigit() or int(size) < 1:
            raise ValueError(f"--mesh={text!r}: give positive sizes of {sharding.AXES}, "
                             "e.g. data=8,fsdp=4")
        sizes[name] = int(size)
    return sizes


def per_device_bytes(tree, specs, mesh_sizes: dict, rules) -> int:
    """Bytes of one device's shards of ``tree`` (shapes), split as the logical ``specs`` say
    (a dimension that does not divide takes the larger shard)."""
    def leaf_bytes(x, spec):
        mesh_axes = tuple(nn.logical_to_mesh_axes(spec, rules)) if spec is not None else ()
        dims = list(x.shape)
        for i, axes in enumerate(mesh_axes[:len(dims)]):
            axes = axes if isinstance(axes, tuple) else (axes,)
            dims[i] = -(-dims[i] // math.prod(mesh_sizes[a] for a in axes if a))
        return math.prod(dims) * jnp.dtype(x.dtype).itemsize

    return sum(jax.tree.leaves(jax.tree.map(
        leaf_bytes, tree, specs, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))))


def tree_bytes(tree) -> int:
    return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def residual_bytes(model, params, batch: int, seq_len: int) -> int:
    """Bytes the training loss's backward pass keeps from its forward pass (shapes only)."""
    def loss(p, tokens):
        logits, _, aux = model.apply(p, tokens, with_aux=True)
        return next_token_nll(logits, tokens).mean() + sum(aux.values(), 0.0)

    tokens = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
    return tree_bytes(jax.eval_shape(lambda p, t: jax.vjp(lambda q: loss(q, t), p)[1],
                                     params, tokens))


def activation_bytes(model_cfg: dict, params, batch: int, seq_len: int) -> int:
    """Residuals that grow with the batch, for ``batch`` examples."""
    model = build(model_cfg)
    return (residual_bytes(model, params, 2 * batch, seq_len)
            - residual_bytes(model, params, batch, seq_len))


def plan(config, mesh_sizes: dict, rules) -> dict:
    """Per-device bytes of a training run of ``config`` on a mesh of ``mesh_sizes``."""
    model = build(config.model.to_dict())
    tx = make_optimizer(config.train)
    abstract = jax.eval_shape(lambda: init_state(config, model, jax.random.key(0)))
    specs = model.logical_axes(jnp.zeros((1, config.data.seq_len), jnp.int32))
    opt_specs = optax.tree_map_params(tx, lambda _, s: s, abstract["opt_state"], specs,
                                      transform_non_params=lambda _: None)
    sharding.check_divisible(abstract["params"], specs, mesh_sizes, rules)  # never "fits"
    n_data = mesh_sizes["data"] * mesh_sizes["fsdp"]
    batch = config.train.batch_size
    if batch % n_data:
        raise ValueError(f"train.batch_size={batch} is not divisible by the {n_data} "
                         f"data-parallel devices (mesh data x fsdp)")
    b = batch // n_data
    params = abstract["params"]
    cfg = config.model.to_dict()
    no_remat = activation_bytes({**cfg, "remat": False}, params, b, config.data.seq_len)
    kept = activation_bytes({**cfg, "remat": True}, params, b, config.data.seq_len)
    with_remat = kept + no_remat // model.cfg.n_layers
    param_bytes = per_device_bytes(params, specs, mesh_sizes, rules)
    out = {
        "mesh": mesh_sizes, "devices": math.prod(mesh_sizes.values()),
        "batch_per_device": b, "seq_len": config.data.seq_len,
        "params_count": sum(math.prod(x.shape) for x in jax.tree.leaves(params)),
        "params": param_bytes,
        "optimizer": per_device_bytes(abstract["opt_state"], opt_specs, mesh_sizes, rules),
        "gradients": param_bytes,  # float32 like the parameters, split the same way
        "activations_no_remat": no_remat, "activations_remat": with_remat,
        "remat": bool(config.model.remat),
    }
    state = out["params"] + out["optimizer"] + out["gradients"]
    out["total_no_remat"], out["total_remat"] = state + no_remat, state + with_remat
    out["total"] = out["total_remat"] if out["remat"] else out["total_no_remat"]
    return out


def fits(total: int, memory: dict) -> dict:
    return {name: total <= size for name, size in memory.items()}


def describe(p: dict, memory: dict) -> str:
    g = lambda n: f"{n / GiB:8.3f} GiB"
    mesh = ",".join(f"{a}={n}" for a, n in p["mesh"].items())
    used = "remat" if p["remat"] else "no remat"
    lines = [f"mesh {mesh} ({p['devices']} devices), preset {p['preset']}: "
             f"{p['params_count'] / 1e6:.1f}M parameters, batch per device "
             f"{p['batch_per_device']} x {p['seq_len']} tokens",
             f"  params              {g(p['params'])}",
             f"  optimizer state     {g(p['optimizer'])}",
             f"  gradients           {g(p['gradients'])}",
             f"  activations         {g(p['activations_no_remat'])}  (no remat)",
             f"                      {g(p['activations_remat'])}  (remat)",
             f"  total               {g(p['total_no_remat'])}  (no remat)",
             f"                      {g(p['total_remat'])}  (remat; the config: {used})"]
    verdict = lambda ok: "fits" if ok else "does not fit"
    lines += [f"  {name:6s} {size / GiB:6g} GiB: {verdict(a)} without remat, {verdict(b)} "
              "with it" for (name, size), a, b in zip(
                  memory.items(), fits(p["total_no_remat"], memory).values(),
                  fits(p["total_remat"], memory).values())]
    return "\n".join(lines)


def main(argv):
    from absl import flags, logging

    from dynjax import errors
    from dynjax.jsonio import check_writable, stamp, write_json_atomic

    del argv
    logging.set_verbosity(logging.WARNING)  # no "Unable to initialize backend" notes
    f = flags.FLAGS
    if f.out:   # before the plan is traced: a bad --out is one line, not a late traceback
        check_writable(pathlib.Path(f.out).absolute().parent, "--out")
    config = f.config
    given = f["device-memory"].value
    with errors.config_errors():  # bad input: one line, exit status 2
        rules = sharding.rules_of(dict(preset=f.preset)) if f.preset else \
            sharding.rules_of(config.sharding)
        memory = {"given": parse_bytes(given)} if given else CHIPS
        result = plan(config, parse_mesh(f.mesh), rules)
    result["preset"] = f.preset or config.sharding.preset
    result["device_memory"] = memory
    result["fits"] = fits(result["total"], memory)
    result["fits_no_remat"] = fits(result["total_no_remat"], memory)
    result["fits_remat"] = fits(result["total_remat"], memory)
    result.update(stamp())
    print(describe(result, memory))
    if f.out:
        pathlib.Path(f.out).absolute().parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(f.out, result)
