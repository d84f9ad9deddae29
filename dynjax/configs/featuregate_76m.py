"""The paper's 76M byte-level model (24 layers, d=512, 8 heads; 75.9M parameters).

    python train.py --config=configs/featuregate_76m.py:feature_gate --workdir=runs/fg76m_s0 \\
        --config.data.source=tfds --config.data.tfds_name=lm1b --config.data.data_dir=DIR

Variants: dense, uniform, layer_static, feature_gate, fixed_depth15 (the FixedDepth15
baseline). For accelerators: bfloat16 compute with float32 params, scanned and
rematerialised layers, data parallel over every device (shard the weights with
``--config.sharding.preset=fsdp --config.sharding.mesh.fsdp=-1 --config.sharding.mesh.data=1``).
Mass-matched uniform: ``:uniform --config.mass_match_run=runs/fg76m_s0``.
"""
from dynjax.configs import common


def get_config(variant: str = "feature_gate"):
    c = common.base(variant)
    c.model.update(dict(d_model=512, n_heads=8, n_layers=24, d_ff=2048, dtype="bfloat16",
                        scan_layers=True, remat=True, controller_hidden=32))
    c.data.seq_len = 512
    c.train.update(dict(steps=100_000, batch_size=64, lr=6e-4, warmup_steps=2000,
                        log_every=100, eval_every=5000, ckpt_every=2000, keep_checkpoints=3))
    c.eval.update(dict(windows=512, batch_size=32))
    return c
