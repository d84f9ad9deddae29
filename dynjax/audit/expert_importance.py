"""Which experts matter: REAP's observational saliency against causal removal (issue 48).

    from dynjax.audit import expert_importance as ei
    report = ei.compare(model, params, windows)     # windows: (N, T) int token windows

Causal importance removes one expert by replaying its router scores with that expert at
-inf (every other coefficient the recorded one); per layer, the Spearman correlation of the
two rankings and what pruning by each costs. Definitions and reasons: docs/audit.md.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

from dynjax import coeffs as coeffs_lib
from dynjax.audit import stats
from dynjax.errors import ConfigError
from dynjax.models import FAMILIES, Routing

FRACTIONS = (0.25, 0.5)
REMOVED = -jnp.inf      # a removed expert's score: below every real one, so top-k skips it


def _check(model):
    if "router" not in model.schema:
        raise ConfigError(f"the {model.cfg.family} model has no 'router' coefficient; expert "
                          "importance needs an MoE (moe or llm family with moe_layers)")
    if not routing(model).token_choice:
        raise ConfigError("expert-choice routing: removing an expert re-routes its tokens "
                          "only under token choice (expert choice ranks tokens, not experts)")


def routing(model) -> Routing:
    """The model's routing facts (``models.Family.routing``)."""
    return FAMILIES[model.cfg.family].routing(model.cfg)


def num_experts(model) -> int:
    return routing(model).num_experts


def top_k(model) -> int:
    return routing(model).top_k


def _batches(windows, batch: int):
    for i in range(0, len(windows), batch):
        yield jnp.asarray(windows[i:i + batch])


@functools.partial(jax.jit, static_argnums=0)
def _replay_nll(model, params, tokens, coeffs, removed):
    """Per-window next-token NLL (nats) with the experts ``removed`` (L, E) bool taken out
    of the given router scores."""
    router = jnp.where(removed[:, None, None, :], REMOVED, coeffs["router"])
    logits, _ = model.apply(params, tokens, coeffs=dict(coeffs, router=router))
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.mean(nll, axis=-1)


class Recorded:
    """The model's coefficients on ``windows`` (recorded once, in batches) and the replay
    of any set of removed experts."""

    def __init__(self, model, params, windows, batch: int = 16):
        _check(model)
        self.model, self.params, self.batch = model, params, batch
        self.windows = np.asarray(windows, np.int32)
        record = jax.jit(model.apply)
        self.coeffs = [record(params, tokens)[1] for tokens in _batches(self.windows, batch)]
        self.n_layers, _, _, self.n_routes = self.coeffs[0]["router"].shape
        self.E, self.k = num_experts(model), top_k(model)

    def full(self) -> dict:
        """The recorded coefficients of every window, (L, N, T, E) leaves."""
        return jax.tree.map(lambda *a: jnp.concatenate(a, axis=1), *self.coeffs)

    def nll_given(self, coeffs) -> np.ndarray:
        """Per-window NLL (nats) replaying ``coeffs`` (every window's, as :meth:`full`)."""
        none = jnp.zeros((self.n_layers, self.n_routes), bool)
        out = []
        for i, tokens in enumerate(_batches(self.windows, self.batch)):
            part = jax.tree.map(lambda a: a[:, i * self.batch:i * self.batch + len(tokens)],
                                coeffs)
            out.append(np.asarray(_replay_nll(self.model, self.params, tokens, part, none),
                                  np.float64))
        return np.concatenate(out)

    def nll(self, removed=None) -> np.ndarray:
        """Per-window NLL (nats) with ``removed`` (L, E) bool experts taken out (None: none)."""
        mask = np.zeros((self.n_layers, self.n_routes), bool)
        if removed is not None:
            removed = np.asarray(removed, bool)
            mask[:, :removed.shape[1]] = removed
            left = self.E - removed.sum(axis=1)
            if np.any(left < self.k):
                raise ConfigError(f"removing {int(removed.sum(1).max())} of {self.E} experts "
                                  f"in a layer leaves fewer than top_k={self.k}")
        out = [_replay_nll(self.model, self.params, tokens, c, jnp.asarray(mask))
               for tokens, c in zip(_batches(self.windows, self.batch), self.coeffs)]
        return np.concatenate([np.asarray(o, np.float64) for o in out])


def causal_importance(rec: Recorded, level: float = 0.95, seed: int = 0,
                      n_resamples: int = 9999) -> dict:
    """ΔNLL (nats per token) of removing each (layer, expert) alone, per window and summarised:
    ``{"base_nll": (W,), "delta": (L, E, W), "mean": (L, E), "ci_low", "ci_high": (L, E),
    "summaries": [[summary]]}``."""
    base = rec.nll()
    L, E = rec.n_layers, rec.E
    delta = np.zeros((L, E, len(base)))
    for layer in range(L):
        for e in range(E):
            removed = np.zeros((L, E), bool)
            removed[layer, e] = True
            delta[layer, e] = rec.nll(removed) - base
    summaries = [[stats.summarize_windows(delta[l, e], level, seed, n_resamples)
                  for e in range(E)] for l in range(L)]
    pick = lambda key: np.array([[s[key] for s in row] for row in summaries])
    return {"base_nll": base, "delta": delta, "mean": delta.mean(-1),
            "ci_low": pick("ci_low"), "ci_high": pick("ci_high"), "summaries": summaries}


# --------------------------------------------------------------------------------- REAP

def _llm_moe_inputs(cfg, params, tokens, coeffs):
    """Each MoE layer's experts' input x (B, T, D), RMS(h + a) (Gemma-4: its experts' own
    norm), replaying ``coeffs``; each layer with its own config and rotary."""
    from dynjax.models import llm

    B, T = tokens.shape
    positions = llm.positions_at(cfg, jnp.broadcast_to(jnp.arange(T), (B, T)))
    h = llm.embed(cfg, params, tokens)
    xs, j = [], 0
    for i, p in enumerate(params["layers"]):
        lc, pos = llm.layer_config(cfg, i), llm.layer_positions(cfg, i, positions)
        if "moe" in p:
            given = coeffs_lib.replaying({name: coeffs[name][j] for name in coeffs})
            a, _, _ = llm.token_mixer(lc, p, llm.norm(cfg, h, p["input_norm"]), pos, None)
            z = h + llm.mixer_update(cfg, p, a)
            gemma = cfg.layer_form == "gemma4"
            xs.append(llm.norm(cfg, z, p["moe"]["in_norm"] if gemma else p["post_norm"]))
            j += 1
        else:
            given = None
        h, _, _ = llm.layer(lc, p, h, pos, given)
    return xs


@functools.partial(jax.jit, static_argnums=0)
def _reap_sums(model, params, tokens, coeffs):
    """Per MoE layer: (sum over routed tokens of g * ||f(x)||, routed-token count), each (E,)."""
    from dynjax.models import llm
    from dynjax.models.components.experts import EXPERTS

    cfg = model.cfg
    moe_params = [p["moe"] for p in params["layers"] if "moe" in p]
    sums, counts = [], []
    for j, x in enumerate(_llm_moe_inputs(cfg, params, tokens, coeffs)):
        p = moe_params[j]
        x = x.reshape(-1, x.shape[-1])
        w = {n: a.astype(cfg.compute_dtype) for n, a in p["experts"].items()}
        norms = jnp.linalg.norm(EXPERTS[cfg.experts].dense(w, x).astype(jnp.float32), axis=-1)
        experts, weights = llm.route(cfg, coeffs["router"][j].reshape(x.shape[0], -1), p)
        routed = jax.nn.one_hot(experts, cfg.num_experts, dtype=jnp.float32)    # (N, k, E)
        gate = jnp.sum(routed * weights.astype(jnp.float32)[..., None], axis=1)  # (N, E)
        sums.append(jnp.sum(gate * norms, axis=0))
        counts.append(jnp.sum(routed, axis=(0, 1)))
    return jnp.stack(sums), jnp.stack(counts)


def reap_saliency(rec: Recorded) -> dict:
    """REAP's saliency (L, E) on the recorded windows, with the routed-token counts."""
    cfg = rec.model.cfg
    if cfg.family != "llm":
        raise ConfigError(f"REAP saliency reads each expert's output, which this module reads "
                          f"from the llm family's layers; the {cfg.family} family is not "
                          "covered (causal importance is)")
    if cfg.mod_layers:
        raise ConfigError("REAP saliency of a model with Mixture-of-Depths layers is not "
                          "covered; export-free MoE models only")
    total = np.zeros((rec.n_layers, rec.E))
    count = np.zeros((rec.n_layers, rec.E))
    for tokens, c in zip(_batches(rec.windows, rec.batch), rec.coeffs):
        s, n = _reap_sums(rec.model, rec.params, tokens, c)
        total += np.asarray(s, np.float64)
        count += np.asarray(n, np.float64)
    return {"saliency": np.where(count > 0, total / np.maximum(count, 1), 0.0),
            "routed_tokens": count}


# ----------------------------------------------------------------------- the comparison

def spearman_per_layer(a, b) -> list:
    """Spearman's rho (and p) between two (L, E) rankings, per layer."""
    out = []
    for x, y in zip(np.asarray(a), np.asarray(b)):
        res = scipy.stats.spearmanr(x, y)
        out.append({"rho": float(res.statistic), "p": float(res.pvalue)})
    return out


def bottom(scores, fraction: float) -> np.ndarray:
    """(L, E) bool: each layer's floor(fraction * E) lowest-scoring experts (ties: lower index)."""
    scores = np.asarray(scores)
    n = int(np.floor(fraction * scores.shape[1]))
    mask = np.zeros(scores.shape, bool)
    for l, row in enumerate(scores):
        mask[l, np.argsort(row, kind="stable")[:n]] = True
    return mask


def pruning_cost(rec: Recorded, rankings: dict, fractions=FRACTIONS,
                 bytes_per_token: float = 1.0) -> dict:
    """Bits per byte with each ranking's bottom ``fractions`` removed together, per layer:
    ``{name: {fraction: {"bits_per_byte", "delta_bits_per_byte", "removed"}}}`` and the
    unpruned ``base_bits_per_byte``. ``bytes_per_token``: 1 for train.py's byte-level runs."""
    to_bits = 1.0 / (np.log(2.0) * bytes_per_token)
    base = float(rec.nll().mean() * to_bits)
    out = {"base_bits_per_byte": base}
    for name, scores in rankings.items():
        out[name] = {}
        for f in fractions:
            removed = bottom(scores, f)
            bpb = float(rec.nll(removed).mean() * to_bits)
            out[name][str(f)] = {"bits_per_byte": bpb, "delta_bits_per_byte": bpb - base,
                                 "removed": [np.flatnonzero(r).tolist() for r in removed]}
    return out


def compare(model, params, windows, batch: int = 16, seed: int = 0,
            n_resamples: int = 9999, bytes_per_token: float = 1.0) -> dict:
    """REAP saliency against causal importance on ``windows``: both (L, E) tables, the
    per-layer Spearman correlation, and the pruning costs of each ranking."""
    rec = Recorded(model, params, windows, batch)
    causal = causal_importance(rec, seed=seed, n_resamples=n_resamples)
    reap = reap_saliency(rec)
    return {
        "windows": int(len(rec.windows)), "tokens_per_window": int(rec.windows.shape[1]),
        "reap_saliency": reap["saliency"].tolist(), "routed_tokens": reap["routed_tokens"].tolist(),
        "causal_delta_nll": causal["mean"].tolist(), "causal_ci_low": causal["ci_low"].tolist(),
        "causal_ci_high": causal["ci_high"].tolist(), "base_nll": float(causal["base_nll"].mean()),
        "spearman": spearman_per_layer(reap["saliency"], causal["mean"]),
        "pruning": pruning_cost(rec, {"reap": reap["saliency"], "causal": causal["mean"]},
                                bytes_per_token=bytes_per_token),
        "ci": "paired percentile bootstrap over evaluation windows (dynjax.audit.stats."
              "summarize_windows), 95%"}
