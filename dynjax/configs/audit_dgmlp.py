"""Frozen-Controller Audit of DynamicGate-MLP classifiers (train.py runs of configs/dgmlp_*.py).

    python audit.py --config=configs/audit_dgmlp.py --out=results/dgmlp/audit_mnist_dgate \\
        --checkpoints runs/curve_mnist/dgate_l0.5 runs/mnist_dgate_s1 runs/mnist_dgate_s2

A window is one labelled example and the loss its cross-entropy. The unit gates have no
token axis, so the token conditions and the 2x2 factorial are reported as not applicable;
Cross-input, LayerMean (each unit's mean gate probability over 2,000 validation examples)
and GlobalMean are measured on 2,000 test examples, one forward of all of them at a time.
Everything else as configs/audit_tiny.py.
"""
from dynjax.configs import audit_tiny


def get_config():
    c = audit_tiny.get_config()
    c.data.calib_windows = 2000
    c.data.eval_windows = 2000
    c.batch_size = 2000
    c.per_window = False     # 2 x 20 x 2000 per-example values would make results.json 2 MB
    return c
