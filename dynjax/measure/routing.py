"""How well Mixture-of-Depths' causal decode rules reproduce training-time top-k routing.

Per rule (``router``: sigmoid(r) > 0.5; ``predictor``: its logit > 0) and per MoD block:
precision, recall and F1 against top-k membership with the base rate beside them (accuracy
would flatter a rule that never routes), on the training forward and on the tokens that
really entered in the causal forward. Details: docs/audit.md (Causal MoD routing).
"""
from __future__ import annotations

import numpy as np

from dynjax.models import build, mod


def routing_stats(model, params, tokens) -> dict:
    """Per MoD block (L, B, T) bool arrays from one forward: top-k membership, the tokens
    that entered, the decode rules' answers, and causal askers that found no slot."""
    _, sown = model.module.apply({"params": params}, tokens, None, mutable=["mod_stats"])
    return sown["mod_stats"]["stats"][0]


def classification(pred, truth) -> dict:
    """Precision, recall, F1 and accuracy of boolean predictions against the truth."""
    pred, truth = np.asarray(pred, bool), np.asarray(truth, bool)
    tp = int(np.sum(pred & truth))
    fp, fn = int(np.sum(pred & ~truth)), int(np.sum(~pred & truth))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1,
            "accuracy": float(np.mean(pred == truth)), "predicted_rate": float(pred.mean())}


def routing_report(model, params, tokens) -> dict:
    """The decode rules against top-k membership, overall and per MoD block."""
    cfg = model.cfg
    train = {k: np.asarray(v) for k, v in routing_stats(model, params, tokens).items()}
    topk = train["topk"]
    rep = {"capacity": cfg.mod.capacity, "mod_layers": list(mod.mod_layer_ids(cfg)),
           "base_rate": float(topk.mean()),
           "never_route_accuracy": float(1.0 - topk.mean()),
           "tokens_per_block": int(topk[0].size)}
    for rule in ("router", "predictor"):
        said = train[f"{rule}_says"]
        dec = {k: np.asarray(v) for k, v in
               routing_stats(build(mod.decode_config(cfg, rule)), params, tokens).items()}
        rep[rule] = {
            "on_topk_forward": classification(said, topk),
            "per_block": [classification(a, b) for a, b in zip(said, topk)],
            "causal_forward": classification(dec["entered"], topk),
            "entered_fraction": float(dec["entered"].mean()),
            "overflow_fraction": float(dec["overflow"].mean())}
    return rep
