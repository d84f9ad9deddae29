"""DynamicGate-MLP and baselines on Fashion-MNIST (55k train / 5k validation / 10k test), from
Debian's ``dataset-fashion-mnist`` package (fetched by the set-up where apt exists).

    python train.py --config=configs/dgmlp_fashion.py:dgate --workdir=runs/fashion_dgate
    python experiments/dgmlp_curve.py --dataset=fashion_mnist      # the lambda_g curve + baselines

Same model and schedule as configs/dgmlp_mnist.py (784-512-512-10, 6000 steps at batch 128).
"""
from dynjax.configs import mlp_common


def get_config(method: str = "dgate"):
    return mlp_common.base(method, "fashion_mnist")
