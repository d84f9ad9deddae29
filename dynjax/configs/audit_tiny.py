"""Frozen-Controller Audit of tiny dynjax runs (the paper's protocol at CPU scale).

    for s in 0 1 2; do python train.py --config=configs/tiny.py:feature_gate \\
        --workdir=runs/fg_s$s --config.seed=$s; done
    python audit.py --config=configs/audit_tiny.py --out=runs/audit_fg \\
        --checkpoints runs/fg_s0 runs/fg_s1 runs/fg_s2

Every condition on 64 + 64 windows (20 paired reassignments), each run directory one unit
(>= 3 seeds); writes DIR/results.json, report.md and plots, a few minutes on 2 CPU cores.
Depth: docs/audit.md#the-tiny-audit-config-dynjaxconfigsaudit_tinypy
"""
import ml_collections

from dynjax.audit.interventions import CONDITIONS


def get_config():
    c = ml_collections.ConfigDict()
    c.seed = 0                   # reassignment r uses jax.random.split(key(seed), R)[r]
    c.reassignments = 20         # R paired reassignments per randomized condition (paper: 20)
    c.conditions = ",".join(CONDITIONS)   # or a comma-separated subset ("correct" required)
    c.batch_size = 64            # rows per forward: windows or (reassignment, window) pairs
    c.max_reassign_bytes = 1 << 30  # reassigned coefficient copies held on device at once
    c.replay_atol = 0.0          # 0: replay must be bitwise; > 0 accepts a tolerance knowingly
    c.variance = True            # variance decomposition of the coefficients (descriptive)
    c.per_window = True          # every per-window ΔNLL in results.json

    c.data = ml_collections.ConfigDict()
    c.data.calib_windows = 64    # from the validation split (paper: 512)
    c.data.eval_windows = 64     # from the test split, non-overlapping (paper: 512)
    # Unset fields fall back to the checkpoint's own data config (source, path, seq_len).
    c.data.seq_len = ml_collections.FieldReference(None, field_type=int)
    c.data.source = ml_collections.FieldReference(None, field_type=str)
    c.data.path = ml_collections.FieldReference(None, field_type=str)
    c.data.tfds_name = ml_collections.FieldReference(None, field_type=str)
    c.data.data_dir = ml_collections.FieldReference(None, field_type=str)
    c.data.validation_path = ml_collections.FieldReference(None, field_type=str)  # MUDD
    c.data.test_path = ml_collections.FieldReference(None, field_type=str)        # MUDD

    c.stats = ml_collections.ConfigDict(dict(level=0.95, n_resamples=9999, seed=0))
    # The paper's prespecified criteria: fix them before looking at the results.
    c.criteria = ml_collections.ConfigDict(dict(
        small_nll_upper=0.002,       # LayerMean "practically small": CI upper bound < this NLL
        high_retention_lower=0.95))  # static retention "high": CI lower bound > this

    # The device mesh the audit runs under (as train.py's): evaluation rows and the cached
    # coefficients split over data x fsdp (batch_size must be a multiple of that), parameters
    # by the preset's rules (fsdp splits the 1.4B MUDDPythia's weights over devices).
    c.sharding = ml_collections.ConfigDict(dict(
        preset="dp", mesh=dict(data=-1, fsdp=1, tensor=1), dcn_data=1, rules=()))

    c.muddpythia = ml_collections.ConfigDict()
    c.muddpythia.path = ml_collections.FieldReference(None, field_type=str)
    c.muddpythia.dtype = "float32"
    c.muddpythia.flops_per_second = ml_collections.FieldReference(None, field_type=float)

    c.hf = ml_collections.ConfigDict()   # a Hugging Face MoE directory (configs/audit_hf.py)
    c.hf.path = ml_collections.FieldReference(None, field_type=str)
    # None: the checkpoint's own torch_dtype (bf16 stays bf16); or float32 / bfloat16
    c.hf.dtype = ml_collections.FieldReference(None, field_type=str)
    c.hf.flops_per_second = ml_collections.FieldReference(None, field_type=float)
    return c
