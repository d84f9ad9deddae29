"""DynamicGate-MLP, RigL and DynamicGate + RigL on PBMC (scanpy's pbmc68k_reduced, 700 cells,
765 genes, 10 cell types; stratified 490 / 104 / 106 split).

    python -m dynjax.data.tabular fetch      # once
    python train.py --config=configs/dgmlp_pbmc.py:dgate_rigl --workdir=runs/pbmc_dgate_rigl

Methods: dense, dropout, dgate, structured, moe, prune, rigl, dgate_rigl.
MLP 765-256-256-10, 1500 steps at batch 64 (~200 epochs: the training set is tiny).
"""
from dynjax.configs import mlp_common


def get_config(method: str = "dgate"):
    c = mlp_common.base(method, "pbmc68k")
    c.model.hidden = (256, 256)
    c.model.dropout = 0.5
    c.train.update(steps=1500, batch_size=64, weight_decay=1e-2, eval_every=500,
                   ckpt_every=500, log_every=50)
    c.gate.update(warmup_steps=200, anneal_steps=600, ramp_steps=600, lambda_g=0.1)
    c.sparse.update(update_every=50)
    c.eval.batch_size = 128
    return c
