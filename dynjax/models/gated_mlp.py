"""DynamicGate-MLP and its baselines: one MLP classifier, one file, several variants.

Every hidden layer computes ``a = relu(W x + b)``; the variant decides which units are
open: ``dense``, ``dropout``, ``dgate`` (a GateNet's hard mask, straight-through),
``structured`` (a fixed fraction of unit blocks, run as smaller matmuls) and ``moe``
(Switch). ``dgate`` and ``structured`` record the gate probabilities, ``moe`` the router's;
replay re-thresholds (or re-top-k's) the masks from the given values.
Depth: docs/models.md#dynamicgate-mlp-and-its-baselines-dynjaxmodelsgated_mlppy
"""
from __future__ import annotations

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from dynjax import coeffs as coeffs_lib
from dynjax.coeffs import Axes

VARIANTS = ("dense", "dropout", "dgate", "structured", "moe")
UNIT_AXES = Axes(("example", "unit"))
EXPERT_AXES = Axes(("example", "expert"))


@dataclasses.dataclass(frozen=True)
class MLPConfig:
    in_dim: int = 784
    hidden: tuple = (512, 512)
    n_classes: int = 10
    variant: str = "dgate"
    dropout: float = 0.2          # dropout variant
    gate_hidden: int = 16         # GateNet bottleneck r; 0 = one linear map
    gate_bias_init: float = 2.0   # gates start open: p = sigmoid(2 / tau) > theta
    tau: float = 1.0              # inference temperature (training anneals towards it)
    theta: float = 0.5            # inference threshold (training schedules towards it)
    min_keep: float = 0.0         # anti-collapse guard: minimum open fraction per example
    block_size: int = 32          # structured
    keep_fraction: float = 0.5    # structured: fraction of blocks open
    capacity_mode: str = "example"  # structured: "example" or "batch"
    n_experts: int = 4            # moe
    capacity_factor: float = 1.25  # moe, training
    eval_capacity_factor: float = 2.0  # moe, evaluation
    balance_coef: float = 0.01    # moe

    def __post_init__(self):
        object.__setattr__(self, "hidden", tuple(int(n) for n in self.hidden))
        validate(self)

    @classmethod
    def from_dict(cls, d):
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ValueError(f"unknown model config fields {unknown}; known: {sorted(fields)}")
        return cls(**d)


def validate(cfg: MLPConfig):
    """Clear errors for configurations that cannot mean anything."""
    if cfg.variant not in VARIANTS:
        raise ValueError(f"unknown model.variant={cfg.variant!r}; choose one of {list(VARIANTS)}")
    if not cfg.hidden or min(cfg.hidden) <= 0:
        raise ValueError(f"model.hidden={cfg.hidden} needs at least one positive layer width")
    if not 0 < cfg.theta < 1:
        raise ValueError(f"gate threshold theta={cfg.theta} must lie in (0, 1): p is a "
                         "sigmoid, so theta <= 0 opens every gate and theta >= 1 closes every one")
    if not cfg.tau > 0:
        raise ValueError(f"gate temperature tau={cfg.tau} must be > 0")
    if not 0 <= cfg.min_keep <= 1:
        raise ValueError(f"model.min_keep={cfg.min_keep} must lie in [0, 1]")
    if not 0 <= cfg.dropout < 1:
        raise ValueError(f"model.dropout={cfg.dropout} must lie in [0, 1)")
    if cfg.variant == "structured":
        bad = [n for n in cfg.hidden if n % cfg.block_size]
        if bad:
            raise ValueError(f"structured gating needs widths divisible by block_size="
                             f"{cfg.block_size}; {bad} are not")
        if not 0 < cfg.keep_fraction <= 1:
            raise ValueError(f"model.keep_fraction={cfg.keep_fraction} must lie in (0, 1]")
        if cfg.capacity_mode not in ("example", "batch"):
            raise ValueError(f"model.capacity_mode={cfg.capacity_mode!r}: use 'example' or 'batch'")
    if cfg.variant == "moe":
        bad = [n for n in cfg.hidden if n % cfg.n_experts]
        if bad:
            raise ValueError(f"moe needs widths divisible by n_experts={cfg.n_experts}; {bad} "
                             "are not")
        if cfg.capacity_factor <= 0 or cfg.eval_capacity_factor <= 0:
            raise ValueError("moe capacity factors must be positive")


def blocks_kept(cfg: MLPConfig, n: int) -> int:
    return max(1, round(cfg.keep_fraction * (n // cfg.block_size)))


def _top_k_mask(scores, k):
    """0/1 mask of exactly k entries per row (the k largest scores)."""
    idx = jax.lax.top_k(scores, k)[1]
    return jnp.sum(jax.nn.one_hot(idx, scores.shape[-1], dtype=scores.dtype), axis=-2)


def hard_mask(cfg: MLPConfig, p, theta, gates_open):
    """The forward mask from gate probabilities p (B, units or blocks); no gradient."""
    p = jax.lax.stop_gradient(p)
    if cfg.variant == "structured":
        k = blocks_kept(cfg, cfg.block_size * p.shape[-1])
        if cfg.capacity_mode == "batch":
            g = jnp.broadcast_to(_top_k_mask(p.mean(axis=0), k), p.shape)
        else:
            g = _top_k_mask(p, k)
    else:
        g = (p > theta).astype(p.dtype)
        k_min = math.ceil(cfg.min_keep * p.shape[-1])
        if k_min:
            g = jnp.maximum(g, _top_k_mask(p, k_min))
    return jnp.where(gates_open, jnp.ones_like(g), g)


def straight_through(g, p):
    """Forward value g exactly (p - p is 0), gradient of p: the straight-through estimator."""
    return g + (p - jax.lax.stop_gradient(p))


class GateNet(nn.Module):
    """Gate logits from the layer input: one bottleneck (r = gate_hidden) or a linear map."""

    n_out: int
    hidden: int
    bias_init: float

    @nn.compact
    def __call__(self, x):
        if self.hidden:
            x = nn.relu(nn.Dense(self.hidden, name="hidden")(x))
        return nn.Dense(self.n_out, name="logits",
                        bias_init=nn.initializers.constant(self.bias_init))(x)


class HiddenLayer(nn.Module):
    """One hidden layer; returns (gated activations, coefficient or None, open mask (B, n)).
    ``given``: the layer's :class:`~dynjax.coeffs.Given` (or None); the controller always
    runs and ``coeffs.site`` picks the coefficient."""

    cfg: MLPConfig
    n: int

    @nn.compact
    def __call__(self, x, given, tau, theta, gates_open, train):
        cfg, n = self.cfg, self.n
        a = nn.relu(nn.Dense(n, name="dense")(x))
        ones = jnp.ones(a.shape, a.dtype)
        if cfg.variant == "dense":
            return a, None, ones
        if cfg.variant == "dropout":
            return nn.Dropout(cfg.dropout, deterministic=not train)(a), None, ones
        if cfg.variant in ("dgate", "structured"):
            n_gates = n if cfg.variant == "dgate" else n // cfg.block_size
            z = GateNet(n_gates, cfg.gate_hidden, cfg.gate_bias_init, name="gate")(x)
            p = coeffs_lib.site(jax.nn.sigmoid(z / tau), given)
            g = hard_mask(cfg, p, theta, gates_open)
            m = straight_through(g, p)
            if cfg.variant == "structured":
                m, g = jnp.repeat(m, cfg.block_size, -1), jnp.repeat(g, cfg.block_size, -1)
            return a * m, p, g
        # moe: top-1 routing over equal slices of the units, with capacity
        E = cfg.n_experts
        probs = coeffs_lib.site(jax.nn.softmax(nn.Dense(E, name="router")(x), axis=-1), given)
        onehot = jax.nn.one_hot(jnp.argmax(probs, -1), E, dtype=probs.dtype)
        factor = cfg.capacity_factor if train else cfg.eval_capacity_factor
        capacity = math.ceil(factor * a.shape[0] / E)
        position = jnp.cumsum(onehot, axis=0) * onehot          # 1-based slot in its expert
        route = onehot * (position <= capacity)
        scale = jnp.sum(probs * route, axis=-1, keepdims=True)  # router prob; 0 if dropped
        g = jnp.repeat(jax.lax.stop_gradient(route), n // E, -1)
        balance = E * jnp.sum(onehot.mean(0) * probs.mean(0))
        self.sow("aux_loss", "balance", cfg.balance_coef * balance)
        return a * g * scale, probs, g


class MLP(nn.Module):
    cfg: MLPConfig

    @nn.compact
    def __call__(self, x, given, tau, theta, gates_open, train):
        cfg = self.cfg
        key = coeff_key(cfg)
        recorded, opens = [], []
        for l, n in enumerate(cfg.hidden):
            layer_given = coeffs_lib.part(given, lambda v, l=l: v[key][l]) if key else None
            x, c, g = HiddenLayer(cfg, n, name=f"layer_{l}")(x, layer_given, tau, theta,
                                                               gates_open, train)
            recorded.append(c)
            opens.append(g)
        logits = nn.Dense(cfg.n_classes, name="out")(x)
        return logits, ({key: recorded} if key else {}), opens


def coeff_key(cfg: MLPConfig):
    return {"dgate": "p", "structured": "p", "moe": "router"}.get(cfg.variant)


class GatedMLP:
    """The MLP family applied functionally; params are a plain pytree.

    ``apply(params, x, coeffs=None, tau=, theta=, gates_open=, train=, rng=)`` returns
    ``(logits, coeffs)``; with ``with_aux=True`` ``(logits, coeffs, aux)`` where ``aux`` has
    ``open`` (the per-layer 0/1 open masks, for :func:`dynjax.measure.macs.model_mac_sums`) and ``losses``
    (sown auxiliary losses, already weighted). ``tau``/``theta`` default to the config's
    inference values and may be traced scalars, so one compiled step serves a schedule.
    """

    def __init__(self, cfg):
        self.cfg = cfg if isinstance(cfg, MLPConfig) else MLPConfig.from_dict(dict(cfg))
        self.module = MLP(self.cfg)
        key = coeff_key(self.cfg)
        axes = EXPERT_AXES if self.cfg.variant == "moe" else UNIT_AXES
        self.schema = {key: [axes] * len(self.cfg.hidden)} if key else {}

    @property
    def dims(self):
        return [self.cfg.in_dim, *self.cfg.hidden, self.cfg.n_classes]

    def init(self, key, x):
        """Fresh parameters, as one compiled program (op by op is slower; same values)."""
        return self._init(key, x)

    @functools.cached_property
    def _init(self):
        def init_params(key, x):
            return self.module.init({"params": key, "dropout": key}, x, None, self.cfg.tau,
                                    self.cfg.theta, False, False)["params"]
        return jax.jit(init_params)

    def apply(self, params, x, coeffs=None, *, tau=None, theta=None, gates_open=False,
              train=False, rng=None, with_aux=False):
        given = coeffs_lib.as_given(coeffs)
        if given.values is not None:
            coeffs_lib.check(given.values, self.schema)
        tau = self.cfg.tau if tau is None else tau
        theta = self.cfg.theta if theta is None else theta
        rngs = {"dropout": rng} if rng is not None else {}
        (logits, coeffs, opens), sown = self.module.apply(
            {"params": params}, x, given, tau, theta, gates_open, train, rngs=rngs,
            mutable=["aux_loss"])
        if not with_aux:
            return logits, coeffs
        losses = {f"{'/'.join(str(getattr(k, 'key', k)) for k in path)}": jnp.sum(sum(v))
                  for path, v in jax.tree_util.tree_flatten_with_path(
                      sown.get("aux_loss", {}), is_leaf=lambda t: isinstance(t, tuple))[0]}
        return logits, coeffs, {"open": opens, "losses": losses}

    def logical_axes(self, x):
        """Logical axis names of every parameter (a pytree of PartitionSpec), as the LM
        families give them: a layer's input features are ``embed`` (split by FSDP), its
        units ``mlp`` (split by tensor parallelism); controllers and the class outputs,
        too small to split, stay whole."""
        return jax.tree_util.tree_map_with_path(
            lambda path, _: _logical_spec(tuple(getattr(k, "key", k) for k in path),
                                          bool(self.cfg.gate_hidden)),
            jax.eval_shape(self.init, jax.random.key(0), x))


def _logical_spec(path, gate_has_hidden: bool) -> jax.sharding.PartitionSpec:
    P = jax.sharding.PartitionSpec
    module, leaf = path[-2], path[-1]
    if module == "dense":                     # layer_l/dense: (inputs, units)
        return P("embed", "mlp") if leaf == "kernel" else P("mlp")
    if module == "out":                       # (last layer's units, classes)
        return P("mlp", None) if leaf == "kernel" else P(None)
    reads_layer_input = module in ("router", "hidden") or (
        module == "logits" and not gate_has_hidden)
    if leaf == "kernel":
        return P("embed" if reads_layer_input else None, None)
    return P(None)


def gate_penalty(coeffs):
    """sum_l (1/n_l) sum_i mean_batch(p_i^l): the expected open fraction, summed over layers."""
    return sum((jnp.mean(p) for p in coeffs.get("p", [])), jnp.zeros(()))


# --------------------------------------------------------------- the structured fast path

def _dense_rows_cols(layer, rows, cols):
    """Kernel and bias of a Dense restricted to input units ``rows`` and outputs ``cols``
    (either may be None = all; both (B, k) per example or (k,) shared)."""
    w, b = layer["kernel"], layer["bias"]
    if rows is not None:
        w = jnp.take(w, rows, axis=0) if rows.ndim == 1 else w[rows]       # (kin, n) | (B, kin, n)
    if cols is not None:
        if cols.ndim == 1:
            w, b = jnp.take(w, cols, axis=-1), jnp.take(b, cols)
        elif w.ndim == 2:
            w, b = jnp.swapaxes(w.T[cols], -1, -2), b[cols]                 # (B, n_in, kout)
        else:
            w = jnp.take_along_axis(w, cols[:, None, :], axis=-1)
            b = b[cols]
    return w, b


def _matmul(x, w):
    return x @ w if w.ndim == 2 else jnp.einsum("bi,bio->bo", x, w)


def structured_forward(cfg: MLPConfig, params, x):
    """Inference of a ``structured`` model computing only open blocks; equals the masked
    forward (``GatedMLP.apply``) up to float reassociation. Per-example mode gathers each
    example's weights (fast at batch 1); batch mode gathers once for the whole batch."""
    if cfg.variant != "structured":
        raise ValueError("structured_forward needs model.variant='structured'")
    bs = cfg.block_size
    idx = None  # open input units of the current layer (None = all)
    for l, n in enumerate(cfg.hidden):
        lp = params[f"layer_{l}"]
        g1w, g1b = _dense_rows_cols(lp["gate"]["hidden"], idx, None) if cfg.gate_hidden else (
            None, None)
        if cfg.gate_hidden:
            h = nn.relu(_matmul(x, g1w) + g1b)
            z = h @ lp["gate"]["logits"]["kernel"] + lp["gate"]["logits"]["bias"]
        else:
            w, b = _dense_rows_cols(lp["gate"]["logits"], idx, None)
            z = _matmul(x, w) + b
        p = jax.nn.sigmoid(z / cfg.tau)
        k = blocks_kept(cfg, n)
        if cfg.capacity_mode == "batch":
            blocks = jnp.sort(jax.lax.top_k(p.mean(axis=0), k)[1])                    # (k,)
            units = (blocks[:, None] * bs + jnp.arange(bs)).reshape(-1)
        else:
            blocks = jnp.sort(jax.lax.top_k(p, k)[1], axis=-1)                         # (B, k)
            units = (blocks[..., None] * bs + jnp.arange(bs)).reshape(x.shape[0], -1)
        w, b = _dense_rows_cols(lp["dense"], idx, units)
        x = nn.relu(_matmul(x, w) + b)
        idx = units
    w, b = _dense_rows_cols(params["out"], idx, None)
    return _matmul(x, w) + b
