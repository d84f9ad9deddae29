"""The routing study's arms (issue 48): ``llm``-family models at the FCA sweep's tiny size,
and the two learned routers again at its larger size (``ARM_large``).

    python train.py --config=configs/routing_study.py:softmax_topk --workdir=runs/rs/softmax_topk_s0
    python experiments/routing_study.py --runs=runs/routing_study      # every arm, 3 seeds

Arms (``ARMS``): ``softmax_topk`` (OLMoE-style), ``deepseek_sigmoid`` (DeepSeek-V3-style,
aux-loss-free bias), ``hash`` (static control), ``attn_gate``, ``mhc`` (dense), each with the
dense model's active parameters within 0.8%; ``softmax_topk_large``, ``deepseek_sigmoid_large``.
Depth: results/routing_study/README.md#the-arms-dynjaxconfigsrouting_studypy
"""
import ml_collections

from dynjax.configs import common

SEQ_LEN, BATCH, LR = 128, 32, 3e-3
TINY_ARMS = ("softmax_topk", "deepseek_sigmoid", "hash", "attn_gate", "mhc")
# the FCA sweep's larger size (experiments/fca_sweep.py: 8 layers, d = 256, lr 1e-3) for the
# learned routers, every width doubled so the active parameters stay the dense model's, on the
# tiny arms' 1500 steps (the same tokens: only the size changes): does the answer move with it?
LARGE = ("softmax_topk", "deepseek_sigmoid")
ARMS = TINY_ARMS + tuple(f"{a}_large" for a in LARGE)
MOE = dict(moe_layers=(0, 1, 2, 3), num_experts=8, top_k=2, moe_intermediate_size=256,
           norm_topk_prob=False)
ARM_FIELDS = {
    "softmax_topk": dict(MOE, router="softmax_topk", moe_load_balance_loss_weight=0.01),
    "deepseek_sigmoid": dict(moe_layers=(0, 1, 2, 3), num_experts=16, top_k=3,
                             moe_intermediate_size=128, shared_expert_size=128,
                             shared_expert_gate=False, router="grouped_topk",
                             router_score="sigmoid", router_bias=True, norm_topk_prob=True,
                             router_bias_rate=1e-3),
    "hash": dict(MOE, router="hash", router_score="softmax"),
    "attn_gate": dict(attn_output_gate=True, intermediate_size=469),
    "mhc": dict(residual="hyper", hc=4, intermediate_size=448),
}
ROUTING_CONDITIONS = ("correct", "cross_input", "token_shuffle", "token_identity",
                      "expert_relabel", "weights_flat", "static_profile", "structure_removed")
GATE_CONDITIONS = ("correct", "cross_input", "token_shuffle", "static_profile",
                   "structure_removed")


def study(arm: str) -> dict:
    """What the study runs on ``arm``: its audit conditions and whether it gets the
    per-layer router table (``layers``), expert importance (``experts``) and the HF export
    check (``hf``). A hash router's experts are its table's: weights_flat (which keeps the
    top-k by score) would not keep them, and a removed expert's tokens have no next
    choice, so neither runs on it; only OLMoE-shaped runs have an HF twin."""
    fields = ARM_FIELDS[_base(arm)]
    router = fields.get("router") if fields.get("moe_layers") else None
    if router is None:
        return dict(conditions=GATE_CONDITIONS, layers=False, experts=False, hf=False)
    conditions = tuple(c for c in ROUTING_CONDITIONS if router != "hash" or c != "weights_flat")
    return dict(conditions=conditions, layers=True, experts=router != "hash",
                hf=arm == "softmax_topk")


def _base(arm: str) -> str:
    return arm.removesuffix("_large")


def model(arm: str) -> dict:
    """The llm.Config fields of ``arm`` (everything the forward reads, set: no source)."""
    base = dict(family="llm", model_type="olmoe", vocab_size=256, hidden_size=128, n_layers=4,
                n_heads=4, n_kv_heads=4, head_dim=32, intermediate_size=512,
                rms_norm_eps=1e-6, rope_theta=10000.0, qk_norm="full", dtype="float32",
                remat=False, attn_block=128, moe_dispatch="dropless")
    fields = {**base, **ARM_FIELDS[_base(arm)]}
    if arm != _base(arm):      # the larger size: twice as wide, twice as deep, heads of 32
        fields.update(hidden_size=256, n_layers=8, n_heads=8, n_kv_heads=8,
                      moe_layers=tuple(range(8)))
        for width in ("intermediate_size", "moe_intermediate_size", "shared_expert_size"):
            if width in fields:
                fields[width] *= 2
    return fields


def get_config(arm: str = "softmax_topk"):
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; choose one of {list(ARMS)}")
    c = common.base("dense")
    c.model = ml_collections.ConfigDict(model(arm))
    c.data.source = "embedded_large"
    c.data.seq_len = SEQ_LEN
    c.train.update(dict(steps=1500, batch_size=BATCH, lr=LR, warmup_steps=100,
                        eval_every=1500, ckpt_every=500))
    if arm != _base(arm):
        c.train.update(dict(lr=1e-3, ckpt_every=250))
    return c
