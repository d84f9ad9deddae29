"""The execution scorecard of a Hugging Face MoE checkpoint: routing variation, the routing
audit's dependence rows, and execution (tokens per expert per layer, active parameters and
FLOPs per token against the dense model of the same total parameters, measured forward time
against the FLOP prediction).

    python scorecard.py --config=configs/scorecard_hf.py --out=DIR --hf=HF_DIR

Everything else as configs/scorecard.py; the audit is configs/audit_hf.py's, quick.
"""
from dynjax.configs import audit_hf, scorecard


def get_config():
    return scorecard.get_config(audit_hf.get_config())
