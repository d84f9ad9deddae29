"""DynamicGate-MLP and baselines on the full MNIST (55k train / 5k validation / 10k test).

    python -m dynjax.data.tabular fetch      # once
    python train.py --config=configs/dgmlp_mnist.py:dgate --workdir=runs/mnist_dgate

Methods (the part after the colon): dense, dropout, dgate, structured, moe, prune, rigl,
dgate_rigl. Override fields, e.g. ``--config.gate.lambda_g=1.0`` for the lambda_g sweep or
``--config.sparse.density=0.6`` to prune to a measured DynamicGate RelMAC.
MLP 784-512-512-10, AdamW, batch 128, 6000 steps (~14 epochs).
"""
from dynjax.configs import mlp_common


def get_config(method: str = "dgate"):
    return mlp_common.base(method, "mnist")
