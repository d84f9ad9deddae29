"""Defaults shared by the MLP-family configs (DynamicGate-MLP and its baselines)."""
import ml_collections

from dynjax.models.gated_mlp import VARIANTS

# name -> (model.variant, sparse.method): the methods train.py can run on a classifier.
METHODS = {"dense": ("dense", "none"), "dropout": ("dropout", "none"),
           "dgate": ("dgate", "none"), "structured": ("structured", "none"),
           "moe": ("moe", "none"), "prune": ("dense", "prune"), "rigl": ("dense", "rigl"),
           "dgate_rigl": ("dgate", "rigl")}


def base(method: str, dataset: str) -> ml_collections.ConfigDict:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {sorted(METHODS)}")
    variant, sparse_method = METHODS[method]
    assert variant in VARIANTS
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.data = ml_collections.ConfigDict(dict(dataset=dataset))
    c.data.data_dir = ml_collections.FieldReference(None, field_type=str)
    c.model = ml_collections.ConfigDict(dict(
        hidden=(512, 512), variant=variant, dropout=0.2, gate_hidden=16, gate_bias_init=2.0,
        tau=0.5, theta=0.5, min_keep=0.1, block_size=32, keep_fraction=0.5,
        capacity_mode="example", n_experts=4, capacity_factor=1.25, eval_capacity_factor=2.0,
        balance_coef=0.01))
    c.gate = ml_collections.ConfigDict(dict(
        warmup_steps=500, anneal_steps=2000, tau_start=1.0, theta_start=0.5,
        lambda_g=0.5, ramp_steps=2000))
    c.sparse = ml_collections.ConfigDict(dict(
        method=sparse_method, sparsity=0.8, update_every=100, drop_fraction=0.3,
        end_fraction=0.75, density=0.5, prune_fraction=0.5))
    c.train = ml_collections.ConfigDict(dict(
        steps=6000, batch_size=128, lr=1e-3, warmup_steps=200, min_lr_ratio=0.01,
        weight_decay=1e-4, clip_norm=1.0, b1=0.9, b2=0.999,
        log_every=100, eval_every=2000, ckpt_every=2000, keep_checkpoints=1,
        skip_nonfinite=False, spike_factor=3.0, allow_changes=False))
    # skip_nonfinite: skip (and count) a step whose loss or gradient is not finite instead
    # of stopping; spike_factor: warn when a logged loss is this many times the running
    # median (0: off); allow_changes: accept changed train.* fields on resume (recorded in
    # RUN/config_history.jsonl). docs/reliability.md
    c.eval = ml_collections.ConfigDict(dict(batch_size=500))
    return c
