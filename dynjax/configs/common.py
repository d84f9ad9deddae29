"""Defaults shared by every config: one place for the fields, presets override a few."""
import ml_collections

from dynjax.models.gates import VARIANTS


def base(variant: str) -> ml_collections.ConfigDict:
    if variant.startswith("fixed_depth"):
        depth = int(variant[len("fixed_depth"):] or 0)
        variant = "fixed_depth"
    else:
        depth = 0
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {list(VARIANTS)} "
                         "(fixed_depth may carry its depth, e.g. fixed_depth15)")
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.model = dict(family="gates", variant=variant, vocab_size=256, d_model=128, n_heads=4,
                   n_layers=4, d_ff=512, rope_base=10000.0, dtype="float32",
                   scan_layers=True, remat=False, fixed_depth=depth, gate_max=2.0,
                   controller_hidden=16, uniform_value=None,
                   attn_impl="jnp", attn_block=128, remat_save_dots=False)  # speed only
    c.model = ml_collections.ConfigDict(c.model)
    c.model.uniform_value = ml_collections.FieldReference(None, field_type=float)
    c.data = ml_collections.ConfigDict(dict(source="embedded", seq_len=128))
    c.data.path = ml_collections.FieldReference(None, field_type=str)
    c.data.tfds_name = ml_collections.FieldReference(None, field_type=str)
    c.data.data_dir = ml_collections.FieldReference(None, field_type=str)
    c.train = ml_collections.ConfigDict(dict(
        steps=1000, batch_size=32, lr=3e-3, warmup_steps=100, min_lr_ratio=0.1,
        weight_decay=0.1, clip_norm=1.0, b1=0.9, b2=0.95,
        log_every=50, eval_every=500, ckpt_every=500, keep_checkpoints=2,
        skip_nonfinite=False, max_skipped_in_a_row=20, spike_factor=3.0, allow_changes=False))
    # skip_nonfinite: skip (and count) a step whose loss or gradient is not finite instead
    # of stopping (stopped when more than max_skipped_in_a_row in a row, or every step since
    # the last save, were skipped); clip_norm: 0 is no clipping; spike_factor: warn when a logged loss is this many times the running
    # median (0: off); allow_changes: accept changed train.* fields on resume (recorded in
    # RUN/config_history.jsonl). docs/reliability.md
    # init_from: start from another run's params, DIR or DIR:STEP (dynjax/train/convert.py:
    # dense -> MoD routers fitted with gain init_router_gain on init_calibration_windows
    # train windows; dense -> MoE experts = copies of the MLP plus init_upcycle_noise * std
    # noise); the loss jump on init_report_windows validation windows goes to metrics.jsonl.
    c.train.update(dict(init_from="", init_router_gain=2.0, init_upcycle_noise=0.0,
                        init_calibration_windows=64, init_report_windows=64))
    # route: the headline routing rule of a routed model ("" = the predictor if trained,
    # else the router; see dynjax.train.evaluation); decode_check_windows: test windows
    # that MoD's KV-cache decoder re-scores to check it agrees with the causal forward.
    c.eval = ml_collections.ConfigDict(dict(windows=512, batch_size=64, route="",
                                            decode_check_windows=32))
    # mesh ("data", "fsdp", "tensor"), one axis -1 = the devices left; preset: dp, fsdp, tp,
    # fsdp_tp, ep (dynjax.parallel.sharding.PRESETS; under ep a dropless MoE exchanges tokens
    # by all-to-all over the "expert" rule's axis); rules, if non-empty, replace the preset's
    # table; dcn_data > 1: a hybrid mesh whose data axis spans that many slices / hosts.
    c.sharding = ml_collections.ConfigDict(dict(
        preset="dp", mesh=dict(data=-1, fsdp=1, tensor=1), dcn_data=1, rules=()))
    c.mass_match_run = ""  # uniform only: fix its gate to this feature_gate run's gate mass
    return c


def family_base(family: str, variant: str, variants) -> ml_collections.ConfigDict:
    """``base`` for another model family built on the same core: its variant checked."""
    if variant not in variants:
        raise ValueError(f"unknown variant {variant!r}; choose one of {list(variants)}")
    c = base("dense")
    c.model.family = family
    c.model.variant = variant
    return c
