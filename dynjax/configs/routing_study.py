"""The routing study's arms (issue 48): ``llm``-family models at the FCA sweep's tiny size.

    python train.py --config=configs/routing_study.py:softmax_topk --workdir=runs/rs/softmax_topk_s0
    python experiments/routing_study.py --runs=runs/routing_study      # every arm, 3 seeds

The tiny size of experiments/fca_sweep.py: 4 layers, d = 128, 4 heads, byte vocabulary,
windows of 128, batch 32, lr 3e-3, ``data.source=embedded_large``. Every arm has the same
active parameters per token: the dense SwiGLU width is 512, and an MoE layer's k routed
experts together are as wide (8 experts of width 256, top-2).

Arms (``ARMS``), with their parameters per token (``llm.param_count``; the dense model
of width 512 has 1,116,288):

- ``softmax_topk`` (1,120,384 active of 3,479,680): OLMoE-style (model_type ``olmoe``: q/k
  RMSNorm over all heads), every layer a softmax top-2 of 8 SwiGLU experts of width 256,
  weights not renormalised, Switch load balance 0.01. Exports as an OLMoE checkpoint
  (``python -m dynjax.export``).
- ``deepseek_sigmoid`` (1,124,544 of 3,680,448): DeepSeek-V3-style, every layer a sigmoid
  router (``grouped_topk``, one group) whose selection-only bias moves by
  DeepSeek's auxiliary-loss-free rule after every step (``router_bias_rate`` u = 1e-3, the
  paper's γ; no balance loss), top-3 of 16 fine-grained experts of width 128 plus one
  always-on shared expert of width 128 (4 x 128 = 512 active), weights the chosen sigmoid
  scores renormalised.
- ``hash`` (1,122,432 of 3,481,728, the table's 512 entries counted): the static control,
  ``softmax_topk`` with each token's 2 experts fixed by a token-id table (router ``hash``:
  built from the seed, every expert serving 64 byte values, never trained); the softmax
  gate still weighs them (learned).
- ``attn_gate`` (1,115,776): dense, each attention head's output times an elementwise
  sigmoid(x W_gate) gate (Qwen3-Next's output gate; ``attn_output_gate``); the SwiGLU
  width 469 pays for the gate's 16,384 weights per layer.
- ``mhc`` (1,118,557): dense on 4 residual streams mixed by manifold-constrained
  hyper-connections (DeepSeek-V4's mHC: pre / post / Sinkhorn comb around each block,
  ``residual`` "hyper"); the SwiGLU width 448 pays for their 24,630 weights per layer.

Every arm's active parameters lie within 0.8% of the dense model's. What the study runs
on each (:func:`study`): the routers get the routing conditions, the per-layer table and
(learned routers) expert importance; the gates and mHC the FeatureGate / MUDD conditions.
"""
import ml_collections

from dynjax.configs import common

SEQ_LEN, BATCH, LR = 128, 32, 3e-3
ARMS = ("softmax_topk", "deepseek_sigmoid", "hash", "attn_gate", "mhc")
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
    fields = ARM_FIELDS[arm]
    router = fields.get("router") if fields.get("moe_layers") else None
    if router is None:
        return dict(conditions=GATE_CONDITIONS, layers=False, experts=False, hf=False)
    conditions = tuple(c for c in ROUTING_CONDITIONS if router != "hash" or c != "weights_flat")
    return dict(conditions=conditions, layers=True, experts=router != "hash",
                hf=arm == "softmax_topk")


def model(arm: str) -> dict:
    """The llm.Config fields of ``arm`` (everything the forward reads, set: no source)."""
    base = dict(family="llm", model_type="olmoe", vocab_size=256, hidden_size=128, n_layers=4,
                n_heads=4, n_kv_heads=4, head_dim=32, intermediate_size=512,
                rms_norm_eps=1e-6, rope_theta=10000.0, qk_norm="full", dtype="float32",
                remat=False, attn_block=128, moe_dispatch="dropless")
    return {**base, **ARM_FIELDS[arm]}


def get_config(arm: str = "softmax_topk"):
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; choose one of {list(ARMS)}")
    c = common.base("dense")
    c.model = ml_collections.ConfigDict(model(arm))
    c.data.source = "embedded_large"
    c.data.seq_len = SEQ_LEN
    c.train.update(dict(steps=1500, batch_size=BATCH, lr=LR, warmup_steps=100,
                        eval_every=1500, ckpt_every=500))
    return c
