"""The execution scorecard's settings: a quick audit, the timing, and every verdict threshold.

    python scorecard.py --config=configs/scorecard.py --out=DIR RUN_DIR [RUN_DIR ...]
    python scorecard.py --out=DIR --muddpythia=HF_DIR --config.audit.data.seq_len=512 \\
        --config.audit.data.validation_path=VALID.txt --config.audit.data.test_path=TEST.txt

Thresholds, fixed before looking at results: "varies" (``varies_min_input_share`` of the
variance left after the static profile), "function depends on it" (a ΔNLL CI above
``depends_min_dnll``), "executes less" (FLOP and latency ratios against the same-size dense
model at most ``executes_less_max_ratio``). Classifier runs: ``classifier_*``. Depth: docs/audit.md#the-scorecard-config-and-its-thresholds-dynjaxconfigsscorecardpy
"""
import ml_collections

from dynjax.configs import audit_tiny


def quick(audit):
    """An audit config at the scorecard's quick settings (5 reassignments, 32 + 32 windows)."""
    audit.reassignments = 5
    audit.data.calib_windows = 32
    audit.data.eval_windows = 32
    return audit


def get_config(audit=None):
    """``audit``: the audit config to run quick (default configs/audit_tiny.py's)."""
    c = ml_collections.ConfigDict()
    c.audit = quick(audit or audit_tiny.get_config())
    c.execution_windows = 8        # test windows timed (the largest latency batch)
    c.latency_batches = (1, 8)     # the paper measured batch 8
    c.latency_repeats = 5
    c.classifier_examples = 1000   # classifier runs: audit examples (calibration and test each)
    c.classifier_latency_repeats = 50
    c.thresholds = ml_collections.ConfigDict(dict(
        varies_min_input_share=0.05, depends_min_dnll=0.01, executes_less_max_ratio=0.9,
        latency_batch=8))
    return c
