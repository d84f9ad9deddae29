"""The routing study's arms (issue 48): ``llm``-family models at the FCA sweep's tiny size.

    python train.py --config=configs/routing_study.py:softmax_topk --workdir=runs/rs/softmax_topk_s0
    python experiments/routing_study.py --runs=runs/routing_study      # every arm, 3 seeds

The tiny size of experiments/fca_sweep.py: 4 layers, d = 128, 4 heads, byte vocabulary,
windows of 128, batch 32, lr 3e-3, ``data.source=embedded_large``. Every arm has the same
active parameters per token: the dense SwiGLU width is 512, and an MoE layer's k routed
experts together are as wide (8 experts of width 256, top-2).

Arms the library trains today:

- ``softmax_topk``: OLMoE-style (model_type ``olmoe``: q/k RMSNorm over all heads), every
  layer a softmax top-2 of 8 SwiGLU experts, weights not renormalised, Switch load balance
  0.01. Exports as an OLMoE checkpoint (``python -m dynjax.export``).

Arms of issue 48 that wait for a component on main (``get_config`` names what is missing):
:data:`NOT_YET`.
"""
import ml_collections

from dynjax.configs import common

SEQ_LEN, BATCH, LR = 128, 32, 3e-3
ARMS = ("softmax_topk",)
NOT_YET = {
    "deepseek_sigmoid": "the auxiliary-loss-free bias update while training: the sigmoid "
                        "router with a selection-only bias and shared experts is on main "
                        "(components/routers.py grouped_topk, from the ports), but train/ "
                        "never updates router_bias and top-k gives it no gradient, so it "
                        "would stay 0",
    "hash": "a hash (token-id table) router in the llm family (DeepSeek-V4's hash routing "
            "is in models/deepseek_v4.py, not a components/routers.py entry llm composes)",
    "attn_gate": "per-head sigmoid attention-output gates in components/attention.py "
                 "(Qwen3-Next's gated attention)",
    "mhc": "hyper-connections in the llm family's layers (components/hyper.py exists and "
           "models/deepseek_v4.py composes it; llm.py does not)",
}


def model(arm: str) -> dict:
    """The llm.Config fields of ``arm`` (everything the forward reads, set: no source)."""
    base = dict(family="llm", model_type="olmoe", vocab_size=256, hidden_size=128, n_layers=4,
                n_heads=4, n_kv_heads=4, head_dim=32, intermediate_size=512,
                rms_norm_eps=1e-6, rope_theta=10000.0, qk_norm="full", dtype="float32",
                remat=False, attn_block=128, moe_dispatch="dropless")
    if arm == "softmax_topk":
        base.update(moe_layers=(0, 1, 2, 3), num_experts=8, top_k=2,
                    moe_intermediate_size=256, norm_topk_prob=False,
                    router="softmax_topk", router_aux_loss_coef=0.01)
    return base


def get_config(arm: str = "softmax_topk"):
    if arm in NOT_YET:
        raise ValueError(f"arm {arm!r} is not trainable yet: missing {NOT_YET[arm]}; "
                         f"trainable arms: {list(ARMS)}")
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; choose one of {list(ARMS)}")
    c = common.base("dense")
    c.model = ml_collections.ConfigDict(model(arm))
    c.data.source = "embedded_large"
    c.data.seq_len = SEQ_LEN
    c.train.update(dict(steps=1500, batch_size=BATCH, lr=LR, warmup_steps=100,
                        eval_every=1500, ckpt_every=500))
    return c
