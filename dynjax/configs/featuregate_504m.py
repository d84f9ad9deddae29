"""The paper's 504M extension (40 layers, d=1024, 16 heads).

    python train.py --config=configs/featuregate_504m.py:feature_gate --workdir=runs/fg504m_s0 \\
        --config.data.source=tfds --config.data.tfds_name=lm1b --config.data.data_dir=DIR

Variants as in featuregate_76m (fixed_depth15 included). On a pod, shard the weights too:
FSDP over a host and tensor parallelism inside it, e.g. ``--config.sharding.preset=fsdp_tp
--config.sharding.mesh.data=-1 --config.sharding.mesh.fsdp=8 --config.sharding.mesh.tensor=4``.
"""
from dynjax.configs import common


def get_config(variant: str = "feature_gate"):
    c = common.base(variant)
    c.model.update(dict(d_model=1024, n_heads=16, n_layers=40, d_ff=4096, dtype="bfloat16",
                        scan_layers=True, remat=True, controller_hidden=32))
    c.data.seq_len = 512
    c.train.update(dict(steps=200_000, batch_size=128, lr=3e-4, warmup_steps=4000,
                        log_every=100, eval_every=5000, ckpt_every=2000, keep_checkpoints=3))
    c.eval.update(dict(windows=512, batch_size=16))
    return c
