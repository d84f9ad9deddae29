"""Language-model evaluation: bits per byte under every routing rule a model has.

Mixture-of-Depths' training top-k sees the future: it is reported, labelled non-causal,
and the headline (``eval.route``) is a causal rule (router threshold or predictor);
families without routing have one rule, ``forward``. ``decode_agreement`` compares the
KV-cache decoder with the causal forward. Under a mesh every process computes the same
figures. Details: docs/training.md (Evaluation).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from dynjax import decoding
from dynjax.models import FAMILIES, build
from dynjax.models.transformer import ModelConfig, next_token_nll
from dynjax.parallel import distributed, sharding

LN2 = math.log(2.0)


def eval_routes(cfg: ModelConfig) -> dict:
    """name -> (config, causal?) for every routing rule the model can be evaluated under."""
    return FAMILIES[cfg.family].eval_routes(cfg)


def headline_route(cfg: ModelConfig, routes: dict, wanted=None) -> str:
    """The route README tables quote: ``wanted`` if given, else the first causal rule
    (the predictor first when it was trained); a model without one falls back to its
    non-causal score, which the eval dict then marks ``causal: false``."""
    if wanted:
        if wanted not in routes:
            raise ValueError(f"eval.route={wanted!r}; this model has {sorted(routes)}")
        return wanted
    causal = [r for r, (_, is_causal) in routes.items() if is_causal]
    if "predictor" in causal and cfg.mod.predictor_weight > 0:
        return "predictor"
    causal = [r for r in causal if r != "predictor"] or causal
    return causal[0] if causal else next(iter(routes))


def make_eval_step(model, mesh=None):
    """The jitted per-window NLL and gate mass; with a mesh, its outputs are replicated."""
    def eval_step(params, tokens):
        logits, coeffs = model.apply(params, tokens)
        nll = next_token_nll(logits, tokens).mean(axis=-1)          # per window
        mass = coeffs["gate"].mean(axis=2).T if "gate" in coeffs else jnp.zeros((tokens.shape[0], 0))
        return nll, mass                                            # (B,), (B, layers)
    if mesh is None:
        return jax.jit(eval_step)
    return jax.jit(eval_step, out_shardings=sharding.replicated(mesh))


def evaluate(eval_step, params, windows: np.ndarray, batch_size: int, put=None):
    """Mean NLL (nats), bits per byte and gate mass over windows; the last batch is padded
    to the compiled shape and the padding is discarded. ``put`` places a host batch on the
    devices (e.g. split over a mesh's data axes)."""
    nlls, masses = [], []
    for lo in range(0, len(windows), batch_size):
        chunk = windows[lo:lo + batch_size]
        pad = batch_size - len(chunk)
        batch = np.concatenate([chunk, np.zeros((pad, chunk.shape[1]), chunk.dtype)]) if pad else chunk
        nll, mass = jax.device_get(eval_step(params, put(batch) if put else batch))
        nlls.append(nll[:len(chunk)])
        masses.append(mass[:len(chunk)])
    nll = float(np.mean(np.concatenate(nlls), dtype=np.float64))
    out = {"nll": nll, "bpb": nll / LN2, "windows": int(len(windows))}
    mass = np.concatenate(masses)
    if mass.shape[1]:
        out["gate_mass_per_layer"] = mass.mean(axis=0).tolist()
        out["gate_mass"] = float(mass.mean())
    return out


class Evaluator:
    """Every routing rule's eval step compiled once; ``__call__`` scores windows under all
    of them and puts the headline rule's figures at the top level."""

    def __init__(self, cfg: ModelConfig, wanted_route=None, mesh=None):
        self.cfg = cfg
        self.routes = eval_routes(cfg)
        self.headline = headline_route(cfg, self.routes, wanted_route)
        self.steps = {name: make_eval_step(build(c), mesh) for name, (c, _) in self.routes.items()}
        self.put = None if mesh is None else functools.partial(
            distributed.put_global, sharding.batch_sharding(mesh))
        self.replicated = None if mesh is None else sharding.replicated(mesh)

    def __call__(self, params, windows, batch_size) -> dict:
        scores = {name: evaluate(step, params, windows, batch_size, self.put)
                  for name, step in self.steps.items()}
        out = dict(scores[self.headline])
        if len(scores) > 1:
            out["route"], out["causal"] = self.headline, self.routes[self.headline][1]
            out["routes"] = {name: {"nll": s["nll"], "bpb": s["bpb"],
                                    "causal": self.routes[name][1]}
                             for name, s in scores.items()}
        return out

    def describe(self, result: dict) -> str:
        """One progress line: the headline, then the other rules, non-causal ones marked."""
        if "routes" not in result:
            return f"bpb {result['bpb']:.4f}"
        parts = [f"{name} {r['bpb']:.4f}" + ("" if r["causal"] else " (non-causal)")
                 for name, r in result["routes"].items() if name != self.headline]
        return f"bpb {result['bpb']:.4f} [{self.headline}]; " + ", ".join(parts)

    def decode_agreement(self, params, windows, batch_size) -> dict:
        """Per causal MoD rule: the KV-cache decoder over ``windows`` against the causal
        forward on the same windows (max |logit difference|, both bits/byte)."""
        if self.cfg.family != "mod" or self.cfg.variant == "dense":
            return {}
        out = {}
        for name, (cfg, causal) in self.routes.items():
            if not causal:
                continue
            model = build(cfg)
            out_sh = {} if self.replicated is None else {"out_shardings": self.replicated}
            fwd = jax.jit(lambda p, t, m=model: m.apply(p, t)[0], **out_sh)
            dec = jax.jit(lambda p, t, c=cfg: decoding.cached_forward(c, p, t)[0], **out_sh)
            diff, nll_f, nll_d = 0.0, [], []
            for lo in range(0, len(windows), batch_size):
                t = np.asarray(windows[lo:lo + batch_size])
                if self.put is None:
                    lf, ld = fwd(params, t), dec(params, t)
                else:   # padded to the compiled batch, which the mesh's data axes divide
                    padded = np.concatenate([t, np.zeros((batch_size - len(t), t.shape[1]),
                                                         t.dtype)])
                    lf, ld = (f(params, self.put(padded))[:len(t)] for f in (fwd, dec))
                diff = max(diff, float(jnp.max(jnp.abs(lf - ld))))
                nll_f.append(np.asarray(next_token_nll(lf, t).mean(-1)))
                nll_d.append(np.asarray(next_token_nll(ld, t).mean(-1)))
            mean = lambda x: float(np.mean(np.concatenate(x), dtype=np.float64)) / LN2
            out[name] = {"windows": int(len(windows)), "max_abs_logit_diff": diff,
                         "forward_bpb": mean(nll_f), "decode_bpb": mean(nll_d)}
        return out
