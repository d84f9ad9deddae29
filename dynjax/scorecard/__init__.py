"""The execution scorecard: three questions about one trained checkpoint, side by side.

The audit paper keeps three properties of a dynamic model apart; the scorecard answers each
for any checkpoint dynjax can load, with a one-line verdict whose threshold lives in
``configs/scorecard.py``:

- *variation*: do the coefficients change with input and position? The audit's variance
  decomposition (shares of layer / example / token / remainder), each leaf's range, and
  for routers the fraction of tokens entering or the routing entropy.
- *functional dependence*: does the fixed model's output depend on them? The audit's ΔNLL
  for cross-input, token shuffle, the static profile and the structure-removed reference,
  with intervals, and LayerMean retention — reused from ``dynjax.audit``, not recomputed.
- *execution*: does it run less? Executed blocks per token relative to all blocks, FLOPs
  relative to the same-size dense model (compiled and analytic), measured forward,
  prefill and per-token decode latency and throughput relative to that dense model at
  batch 1 and 8, KV-cache bytes.

Checkpoints without coefficients (dense, fixed_depth) have no variation or dependence to
report; they get the execution panel only. Each kind of checkpoint (:mod:`dynjax.audit.targets`)
brings its own execution question (:mod:`dynjax.measure.execution`):

- DynamicGate-MLP classifiers (``train.py`` runs of ``configs/dgmlp_*.py``): open units
  per example, RelMAC, and the FLOPs and latency of the masked forward (and of the
  structured variant's open-blocks path) against the dense MLP of the same widths
  (``dynjax.measure.mlp_execution``);
- MUDDPythia HF directories: every block runs for every token; FLOPs and latency against
  the same weights with static mixing (each layer's ``dense_bs`` bias, no DA MLP);
- Hugging Face MoE directories (``scorecard.py --hf``): tokens per expert per layer, active
  parameters, FLOPs and forward time against the dense model of the same total parameters
  (docs/audit_hf.md).
"""
from __future__ import annotations

from dynjax.scorecard.panels import (INPUT_AXES, PANEL_CONDITIONS, VERDICT_ORDER, dependence,
                                     input_share, variation, verdicts)
from dynjax.scorecard.report import plot, render_markdown, write
from dynjax.scorecard.run import score

__all__ = ["INPUT_AXES", "PANEL_CONDITIONS", "VERDICT_ORDER", "dependence", "input_share",
           "plot", "render_markdown", "score", "variation", "verdicts", "write"]
