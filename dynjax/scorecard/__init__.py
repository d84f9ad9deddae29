"""The execution scorecard: three questions about one trained checkpoint, side by side.

*Variation* (do the coefficients change with input and position?), *functional dependence*
(does the fixed model's output depend on them? the audit's numbers, reused) and *execution*
(does it run less? each checkpoint kind's panel, :mod:`dynjax.measure.execution`), each with
a one-line verdict whose threshold is in ``configs/scorecard.py``. Panels per kind, the
verdicts and the files written: docs/audit.md (The execution scorecard).
"""
from __future__ import annotations

from dynjax.scorecard.panels import (INPUT_AXES, PANEL_CONDITIONS, VERDICT_ORDER, dependence,
                                     input_share, variation, verdicts)
from dynjax.scorecard.report import plot, render_markdown, write
from dynjax.scorecard.run import score

__all__ = ["INPUT_AXES", "PANEL_CONDITIONS", "VERDICT_ORDER", "dependence", "input_share",
           "plot", "render_markdown", "score", "variation", "verdicts", "write"]
