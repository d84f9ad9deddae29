"""Build tests/data/deepseek_v4_parts.npz: transformers' DeepSeek-V4 pieces on fixed inputs.

    pip install -e '.[hf]'          # torch (CPU) + transformers >= 5.24: this script only
    python scripts/make_deepseek_v4_reference.py [--out=tests/data/deepseek_v4_parts.npz]

Tiny random modules of ``transformers.models.deepseek_v4`` in float32 (hc_mult 4, hidden
16, 20 Sinkhorn iterations, 8 experts, top-2):

- ``hc.*``: one ``DeepseekV4HyperConnection`` (``fn``, ``base``, ``scale``), the streams
  ``hc.h`` (2, 7, 4, 16), its outputs ``hc.post``, ``hc.comb`` (Sinkhorn's output) and the
  collapsed block input ``hc.collapsed``; a block output ``hc.out`` and the layer's mixed
  streams ``hc.mixed`` (the decoder layer's own expression);
- ``head.*``: ``DeepseekV4HyperHead`` on the same streams and its output;
- ``router.*`` / ``hash.*``: ``DeepseekV4TopKRouter`` (sqrt-softplus, selection-only bias,
  renormalised, scaled) and ``DeepseekV4HashRouter`` (``tid2eid`` table) on ``router.x``
  (14, 16) and token ids ``hash.ids``: their weights and expert indices;
- ``mlp.*``: the clamped SwiGLU (``DeepseekV4MLP``, ``swiglu_limit``) on ``mlp.x``.

Weights are drawn at scales where every piece matters: ``fn`` large enough that pre, post
and comb vary by token, ``scale`` and ``base`` away from 1 and 0; router weights so the
top-k margins are far above float32 noise (the script checks); MLP weights so the clamp
binds on some entries (the script checks). tests/integration/loaders/test_deepseek_v4.py compares
``dynjax.models.components`` against it without torch.
"""
from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse  # noqa: E402

import numpy as np  # noqa: E402

import make_hf_fixtures as base  # noqa: E402  save_checkpoint

SIZES = dict(hidden_size=16, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
             n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=12,
             vocab_size=32, num_hidden_layers=2, swiglu_limit=1.5,
             routed_scaling_factor=1.5, scoring_func="sqrtsoftplus")


def build() -> dict:
    import torch
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

    torch.manual_seed(0)
    cfg = DeepseekV4Config(**SIZES)
    n, D, E = cfg.hc_mult, cfg.hidden_size, cfg.n_routed_experts
    out = {}
    with torch.no_grad():
        hc = m.DeepseekV4HyperConnection(cfg).float()
        hc.fn.copy_(torch.randn_like(hc.fn) * 0.6)
        hc.base.copy_(torch.randn_like(hc.base) * 0.5)
        hc.scale.copy_(torch.tensor([1.3, 0.7, 1.6]))
        h = torch.randn(2, 7, n, D)
        post, comb, collapsed = hc(h)
        block_out = torch.randn(2, 7, D)
        mixed = post.unsqueeze(-1) * block_out.unsqueeze(-2) + torch.matmul(
            comb.transpose(-1, -2), h)
        out.update({"hc.fn": hc.fn, "hc.base": hc.base, "hc.scale": hc.scale, "hc.h": h,
                    "hc.post": post, "hc.comb": comb, "hc.collapsed": collapsed,
                    "hc.out": block_out, "hc.mixed": mixed})
        head = m.DeepseekV4HyperHead(cfg).float()
        head.hc_fn.copy_(torch.randn_like(head.hc_fn) * 0.6)
        head.hc_base.copy_(torch.randn_like(head.hc_base) * 0.5)
        head.hc_scale.copy_(torch.tensor([0.8]))
        out.update({"head.fn": head.hc_fn, "head.base": head.hc_base,
                    "head.scale": head.hc_scale, "head.y": head(h)})

        router = m.DeepseekV4TopKRouter(cfg).float()
        router.weight.copy_(torch.randn_like(router.weight) * 1.5)
        router.e_score_correction_bias.copy_(torch.randn(E) * 0.3)
        x = torch.randn(14, D)
        _, w, idx = router(x)
        scores = torch.sqrt(torch.nn.functional.softplus(x @ router.weight.T))
        ranked = torch.sort(scores + router.e_score_correction_bias, descending=True).values
        margin = float((ranked[:, 1] - ranked[:, 2]).min())
        assert margin > 1e-3, f"router top-k margin {margin} too close to noise; reseed"
        out.update({"router.weight": router.weight, "router.bias":
                    router.e_score_correction_bias, "router.x": x, "router.w": w,
                    "router.idx": idx, "router.margin": torch.tensor(margin)})

        hashr = m.DeepseekV4HashRouter(cfg).float()
        hashr.weight.copy_(router.weight)
        table = torch.stack([torch.randperm(E)[:cfg.num_experts_per_tok]
                             for _ in range(cfg.vocab_size)])
        hashr.tid2eid.copy_(table)
        ids = torch.randint(0, cfg.vocab_size, (14,))
        _, hw, hidx = hashr(x, ids)
        out.update({"hash.table": table, "hash.ids": ids, "hash.w": hw, "hash.idx": hidx})

        mlp = m.DeepseekV4MLP(cfg).float()
        for lin in (mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            lin.weight.copy_(torch.randn_like(lin.weight) * 0.5)
        xm = torch.randn(14, D)
        gate, up = mlp.gate_proj(xm), mlp.up_proj(xm)
        clamped = float((gate > cfg.swiglu_limit).float().mean()), float(
            (up.abs() > cfg.swiglu_limit).float().mean())
        assert min(clamped) > 0.05, f"the clamp binds too rarely {clamped}; rescale"
        out.update({"mlp.gate": mlp.gate_proj.weight, "mlp.up": mlp.up_proj.weight,
                    "mlp.down": mlp.down_proj.weight, "mlp.x": xm, "mlp.y": mlp(xm)})
        out.update(v32_indexer())
    return {k: np.asarray(v.detach().numpy()) for k, v in out.items()}


def v32_indexer() -> dict:
    """``idx.*``: DeepSeek-V3.2's ``DeepseekV32Indexer`` (4 heads of 12, rotary on the first
    8 channels) on x (2, 11, 16) and a q residual (2, 11, 10): its top-3 under the causal
    mask (``idx.top3``) and its full ranking of every key with nothing masked
    (``idx.rank``), with the rotary table ``idx.cos``/``idx.sin`` it was given."""
    import torch
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as m
    from transformers.models.deepseek_v32.configuration_deepseek_v32 import DeepseekV32Config

    cfg = DeepseekV32Config(hidden_size=16, q_lora_rank=10, qk_rope_head_dim=8,
                            index_n_heads=4, index_head_dim=12, index_topk=3,
                            num_attention_heads=2, qk_nope_head_dim=8, v_head_dim=8,
                            kv_lora_rank=8)
    mod = m.DeepseekV32Indexer(cfg, 0).float()
    for lin in (mod.wq_b, mod.wk, mod.weights_proj):
        lin.weight.copy_(torch.randn_like(lin.weight) * 0.7)
    mod.k_norm.weight.copy_(1 + 0.3 * torch.randn(12))
    mod.k_norm.bias.copy_(0.3 * torch.randn(12))
    B, T = 2, 11
    x, q_res = torch.randn(B, T, 16), torch.randn(B, T, 10)
    pos = torch.arange(T)[None].expand(B, -1)
    cos, sin = m.DeepseekV32RotaryEmbedding(cfg)(x, pos)
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None].expand(B, -1, -1)
    top3 = mod(x, q_res, (cos, sin), causal, pos)
    mod.index_topk = T
    rank = mod(x, q_res, (cos, sin), torch.ones(B, T, T, dtype=torch.bool), pos)
    out = {"idx.q_b": mod.wq_b.weight, "idx.k": mod.wk.weight, "idx.k_norm": mod.k_norm.weight,
           "idx.k_norm_bias": mod.k_norm.bias, "idx.weights": mod.weights_proj.weight,
           "idx.x": x, "idx.q_res": q_res, "idx.cos": cos, "idx.sin": sin, "idx.top3": top3,
           "idx.rank": rank}
    return out


MODEL = dict(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
             head_dim=16, q_lora_rank=16, partial_rotary_factor=0.5, n_routed_experts=8,
             num_experts_per_tok=2, moe_intermediate_size=12,
             layer_types=["heavily_compressed_attention", "compressed_sparse_attention",
                          "sliding_attention", "compressed_sparse_attention"],
             mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"],
             compress_rates={"compressed_sparse_attention": 4,
                             "heavily_compressed_attention": 8},
             sliding_window=6, o_groups=2, o_lora_rank=8, index_n_heads=2, index_head_dim=12,
             index_topk=2, hc_mult=4, swiglu_limit=1.0, initializer_range=0.15,
             rope_parameters={"rope_type": "yarn", "factor": 4.0,
                              "original_max_position_embeddings": 16,
                              "beta_fast": 32, "beta_slow": 1})
BATCH, SEQ_LEN, PROMPT, NEW = 2, 20, 9, 8
MIN_MARGIN = 1e-3


def topk_margin(scores, k):
    """The smallest gap between the k-th and (k+1)-th finite score of any row (inf: none)."""
    import torch
    s = torch.sort(scores, dim=-1, descending=True).values
    gap = s[..., k - 1] - s[..., k]
    gap = gap[torch.isfinite(gap)]
    return float(gap.min()) if gap.numel() else float("inf")


# The FP4 fixture (tests/data/hf/deepseek_v4_fp4): experts as V4-Flash ships them, int8
# pairs of e2m1 values with one e8m0 scale per row and 32 inputs, so every expert matrix
# is 32 wide; two layers (sliding + hash, CSA + learned router)
FP4_MODEL = dict(MODEL, num_hidden_layers=2, moe_intermediate_size=32,
                 layer_types=["sliding_attention", "compressed_sparse_attention"],
                 mlp_layer_types=["hash_moe", "moe"])
FP4_QUANTIZATION = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                    "weight_block_size": [128, 128], "activation_scheme": "dynamic",
                    "expert_dtype": "fp4"}
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)


def quantize_fp4(w: np.ndarray):
    """(packed int8 (N, K/2), e8m0 exponent bytes (N, K/32), the values they hold (N, K)):
    per row and 32 inputs, the power of two that brings the largest |w| to at most 6,
    then each value to its nearest e2m1 (low nibble first in each byte)."""
    N, K = w.shape
    g = w.reshape(N, K // 32, 32).astype(np.float32)
    amax = np.maximum(np.abs(g).max(-1, keepdims=True), 1e-30)
    exp = np.ceil(np.log2(amax / 6.0)).astype(np.int32)
    q = g / np.exp2(exp)
    code = np.abs(np.abs(q)[..., None] - E2M1).argmin(-1).astype(np.uint8)
    code |= np.where((q < 0) & (code > 0), 8, 0).astype(np.uint8)
    values = (np.sign(q) * E2M1[code & 7] * np.exp2(exp)).reshape(N, K)
    code = code.reshape(N, K)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).astype(np.uint8).view(np.int8)
    return packed, (exp[..., 0] + 127).astype(np.uint8), values.astype(np.float32)


def _round_experts_to_fp4(model):
    """Every routed expert's weights replaced by the FP4 values they will be stored as."""
    import torch
    for layer in model.model.layers:
        ex = layer.mlp.experts
        for p in (ex.gate_up_proj, ex.down_proj):
            p.copy_(torch.from_numpy(np.stack([quantize_fp4(w)[2] for w in p.numpy()])))


def _store_experts_as_fp4(out: pathlib.Path):
    """Rewrite model.safetensors with each ``experts.E.wN.weight`` FP4-packed beside its
    ``.scale`` (F8_E8M0), and config.json's quantization_config as V4-Flash's."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    tensors = load_file(path)
    for name in [n for n in tensors if ".experts." in n and n.endswith(".weight")]:
        packed, scale, values = quantize_fp4(tensors[name].numpy())
        assert np.array_equal(values, tensors[name].numpy()), name   # already FP4 values
        tensors[name] = torch.from_numpy(packed)
        tensors[name[:-7] + ".scale"] = torch.from_numpy(scale).view(torch.float8_e8m0fnu)
    save_file(tensors, path, metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = FP4_QUANTIZATION
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def build_model(out: pathlib.Path, sizes: dict = MODEL, fp4: bool = False) -> dict:
    """A tiny random DeepseekV4ForCausalLM (HCA, CSA, sliding, CSA layers; two hash-routed
    layers) saved with its config; reference.npz: input ids, logits, each MoE layer's expert
    indices, each CSA layer's indexer selection (-1: none), a greedy continuation. ``fp4``:
    the experts rounded to FP4 before the reference runs and stored FP4-packed."""
    import torch
    import transformers
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

    cfg = transformers.DeepseekV4Config(**sizes)
    cfg._attn_implementation = "eager"
    for seed in range(20):
        torch.manual_seed(seed)
        model = transformers.DeepseekV4ForCausalLM(cfg).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("sinks", "position_bias")):
                    p.normal_(0.0, 1.0)
                elif name.endswith(("hc.base", "hc_base")):
                    p.normal_(0.0, 0.5)
                elif name.endswith(("hc.scale", "hc_scale")):
                    p.uniform_(0.5, 1.5)
                elif name.endswith("norm.weight"):
                    p.copy_(1 + 0.2 * torch.randn_like(p))
                elif name.endswith("mlp.gate.weight"):
                    p.normal_(0.0, 0.6)
                elif ".indexer." in name and name.endswith("proj.weight"):
                    p.normal_(0.0, 0.5)     # indexer scores of order 1
            for layer in model.model.layers:
                gate = layer.mlp.gate
                if isinstance(gate, m.DeepseekV4HashRouter):
                    gate.tid2eid.copy_(torch.stack([torch.randperm(cfg.n_routed_experts)[
                        :cfg.num_experts_per_tok] for _ in range(cfg.vocab_size)]))
                else:
                    gate.e_score_correction_bias.normal_(0.0, 0.2)
            if fp4:
                _round_experts_to_fp4(model)
        seen = {"experts": [], "router_scores": [], "index": [], "index_scores": []}
        hooks = []
        for layer in model.model.layers:
            gate = layer.mlp.gate

            def on_router(mod, args, output):
                seen["experts"].append(output[2].reshape(BATCH, -1, cfg.num_experts_per_tok))
                if isinstance(mod, m.DeepseekV4TopKRouter):
                    seen["router_scores"].append(torch.sqrt(torch.nn.functional.softplus(
                        output[0])) + mod.e_score_correction_bias)
            hooks.append(gate.register_forward_hook(on_router))
            comp = layer.self_attn.compressor
            if isinstance(comp, m.DeepseekV4CSACompressor):
                hooks.append(comp.indexer.register_forward_hook(
                    lambda mod, args, output: seen["index"].append(output)))
                hooks.append(comp.indexer.scorer.register_forward_hook(
                    lambda mod, args, output: seen["index_scores"].append(output)))
        ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ_LEN), generator=torch.Generator()
                            .manual_seed(1234))
        with torch.no_grad():
            logits = model(ids).logits
        for h in hooks:
            h.remove()
        router_margin = min(topk_margin(s, cfg.num_experts_per_tok)
                            for s in seen["router_scores"])
        index_margin = min(_index_margin(s, cfg) for s in seen["index_scores"])
        print(f"seed {seed}: router margin {router_margin:.3g}, indexer {index_margin:.3g}")
        if min(router_margin, index_margin) > MIN_MARGIN:
            break
    else:
        raise SystemExit(f"no seed gave top-k margins above {MIN_MARGIN}")
    with torch.no_grad():
        greedy = model.generate(ids[:, :PROMPT], max_new_tokens=NEW, do_sample=False,
                                min_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
    base.save_checkpoint(model, out)
    if fp4:
        _store_experts_as_fp4(out)
    write_tokenizer(out)
    np.savez(out / "reference.npz", input_ids=ids.numpy(), logits=logits.numpy(),
             experts=np.stack([e.numpy() for e in seen["experts"]]),
             index=np.stack([i.numpy() for i in seen["index"]]),
             greedy=greedy.numpy(), seed=seed, router_margin=router_margin,
             index_margin=index_margin, transformers=transformers.__version__,
             torch=torch.__version__)
    return {"seed": seed, "router_margin": router_margin, "index_margin": index_margin}


def _index_margin(scores, cfg):
    """Top-k margin of the indexer's scores over the entries each query may see."""
    import torch
    rate = cfg.compress_rates["compressed_sparse_attention"]
    T, W = scores.shape[1], scores.shape[2]
    visible = torch.arange(W)[None, :] < ((torch.arange(T) + 1) // rate)[:, None]
    masked = scores.masked_fill(~visible, float("-inf"))
    rows = visible.sum(-1) > cfg.index_topk      # only rows where the selection chooses
    return topk_margin(masked[:, rows], cfg.index_topk)


V32 = dict(vocab_size=64, hidden_size=32, num_hidden_layers=3, intermediate_size=48,
           moe_intermediate_size=12, num_attention_heads=4, num_key_value_heads=4,
           q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
           v_head_dim=8, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
           n_shared_experts=1, first_k_dense_replace=1, norm_topk_prob=True,
           routed_scaling_factor=2.5, index_n_heads=16, index_head_dim=16, index_topk=5,
           initializer_range=0.15,
           rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                original_max_position_embeddings=16, beta_fast=32.0,
                                beta_slow=1.0, mscale=1.0, mscale_all_dim=0.8))


GLM5 = dict(V32, num_hidden_layers=4, n_group=1, topk_group=1, first_k_dense_replace=1,
            indexer_types=["full", "shared", "full", "shared"],
            mlp_layer_types=["dense", "sparse", "sparse", "sparse"])
GLM5.pop("rope_parameters")
GLM5["rope_parameters"] = dict(rope_type="default", rope_theta=10000.0)


def build_sparse(model_type: str, sizes: dict, out: pathlib.Path) -> dict:
    """A tiny random DeepSeek-V3.2-style checkpoint (the V3 stack plus the lightning
    indexer): reference.npz holds input ids, logits, each indexing layer's top-k (its
    scores' top-k margin above 1e-3 wherever a query sees more keys than it keeps), each
    MoE layer's experts and a greedy continuation."""
    import torch
    import transformers

    cfg = transformers.AutoConfig.for_model(model_type, **sizes)
    cfg._attn_implementation = "eager"
    T = SEQ_LEN
    for seed in range(30):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
        seen = {"index": [], "scores": [], "experts": []}
        hooks = []
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("mlp.gate.weight"):
                    p.normal_(0.0, 0.5)
                elif ".indexer." in name and name.endswith("weight") and "norm" not in name:
                    p.normal_(0.0, 0.5)
        for layer in model.model.layers:
            idx = getattr(layer.self_attn, "indexer", None)
            if idx is not None:
                hooks.append(idx.register_forward_hook(
                    lambda mod, args, output: seen["index"].append(output)))
                hooks.append(idx.register_forward_pre_hook(_capture_inputs(seen),
                                                           with_kwargs=True))
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(gate, "e_score_correction_bias"):
                hooks.append(gate.register_forward_hook(
                    lambda mod, args, output: seen["experts"].append(output[2])))
        ids = torch.randint(0, cfg.vocab_size, (BATCH, T),
                            generator=torch.Generator().manual_seed(1234))
        with torch.no_grad():
            logits = model(ids).logits
        for h in hooks:
            h.remove()
        with torch.no_grad():
            margin = _indexer_margin(seen, cfg.index_topk)
            greedy = model.generate(ids[:, :PROMPT], max_new_tokens=NEW, do_sample=False,
                                    min_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
            # the continuation must be tie-free too (relu leaves exact-zero scores whose
            # order torch and XLA break differently), and the forward must agree with it
            seen["scores"].clear()
            hooks = [l.self_attn.indexer.register_forward_pre_hook(
                _capture_inputs(seen), with_kwargs=True) for l in model.model.layers
                if getattr(l.self_attn, "indexer", None) is not None]
            again = model(greedy).logits
            for h in hooks:
                h.remove()
            margin = min(margin, _indexer_margin(seen, cfg.index_topk))
            agrees = bool((again[:, PROMPT - 1:-1].argmax(-1) == greedy[:, PROMPT:]).all())
        print(f"seed {seed}: indexer top-k margin {margin:.3g}, forward agrees {agrees}")
        if margin > MIN_MARGIN and agrees:
            break
    else:
        raise SystemExit(f"no seed gave indexer margins above {MIN_MARGIN}")
    base.save_checkpoint(model, out)
    write_tokenizer(out)
    np.savez(out / "reference.npz", input_ids=ids.numpy(), logits=logits.numpy(),
             index=np.stack([i.numpy() for i in seen["index"]]),
             experts=np.stack([e.reshape(BATCH, T, -1).numpy() for e in seen["experts"]]),
             greedy=greedy.numpy(), seed=seed, index_margin=margin,
             transformers=transformers.__version__, torch=torch.__version__)
    return {"seed": seed, "index_margin": margin}


def _capture_inputs(seen):
    def hook(mod, args, kwargs):
        seen["scores"].append((mod, args, kwargs))
    return hook


def _indexer_margin(seen, k):
    """The smallest k-th minus (k+1)-th causal indexer score of any query that sees more
    than k keys, the scores recomputed from each indexer's captured inputs (the module
    returns only its top-k): sum_h w_h relu(q_h . k_t) d^-1/2, as its forward computes."""
    import torch
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb
    from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as glm
    worst = float("inf")
    for mod, args, kwargs in seen["scores"]:
        rotate = glm.apply_rotary_pos_emb_interleave if isinstance(mod, glm.GlmMoeDsaIndexer) \
            else apply_rotary_pos_emb
        x, q_res, (cos, sin) = args[0], args[1], args[2]
        B, T, _ = x.shape
        r = mod.qk_rope_head_dim
        q = mod.wq_b(q_res).view(B, T, mod.n_heads, mod.head_dim)
        kk = mod.k_norm(mod.wk(x)).unsqueeze(2)
        q_rot, k_rot = rotate(q[..., :r], kk[..., :r], cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q[..., r:]], -1)
        kk = torch.cat([k_rot, kk[..., r:]], -1).squeeze(2)
        sc = torch.relu(torch.einsum("bshd,btd->bsht", q, kk) * mod.softmax_scale)
        w = mod.weights_proj(x) * mod.n_heads ** -0.5
        scores = torch.einsum("bsht,bsh->bst", sc, w)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        masked = scores.masked_fill(~causal, float("-inf"))
        rows = causal.sum(-1) > k
        worst = min(worst, topk_margin(masked[:, rows], k))
    return worst


FIXTURES = ("deepseek_v4", "deepseek_v4_fp4", "deepseek_v32", "glm_moe_dsa")


def write_tokenizer(out: pathlib.Path):
    """A BPE of the fixture's vocabulary over the embedded corpus (``tokenizer.json``), so
    ``audit.py --hf`` reads real text into it; the reference logits do not depend on it."""
    import json

    vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    base.train_tokenizer(out / "tokenizer.json", vocab)


def _selection_rows(idx, n: int) -> np.ndarray:
    """transformers' indexer picks (..., k) of entry indices (-1: none) as a mask (..., n)."""
    idx = np.asarray(idx).astype(np.int64)
    mask = np.zeros(idx.shape[:-1] + (n + 1,), bool)
    np.put_along_axis(mask, np.where(idx < 0, n, idx), True, -1)
    return mask[..., :n]


def write_rows(rows: dict, path: pathlib.Path,
               checked_by: str = "python scripts/make_deepseek_v4_reference.py --check"):
    """Put ``rows`` into the ``architectures`` of the parity file (results/hf_parity.json,
    which make_hf_fixtures.py writes) beside its rows, atomically; print each. ``checked_by``:
    the command that recomputes them (every fixture builder's ``--check``)."""
    import json

    from dynjax import jsonio

    table = json.loads(path.read_text()) if path.exists() else {"architectures": {}}
    rows = {n: {**r, "checked_by": checked_by} for n, r in rows.items()}
    table["architectures"].update(rows)
    table["architectures"] = dict(sorted(table["architectures"].items()))
    for name, row in rows.items():
        print(name, row, flush=True)
    jsonio.write_json_atomic(str(path), table)
    print(f"parity rows of {', '.join(rows)}: {path}")


def parity(out: pathlib.Path) -> dict:
    """A committed fixture against its reference.npz, read by ``dynjax.loaders.hf.load``
    (jitted float32): max |dlogit|, and whether every MoE layer's expert sets and every
    indexer's selections are transformers' on every token."""
    import jax

    from dynjax.loaders import hf
    from dynjax.models import deepseek_v4 as v4
    from dynjax.models import llm
    from dynjax.models.components import indexer

    ref = dict(np.load(out / "reference.npz"))
    model, params = hf.load(str(out))
    ids = ref["input_ids"]
    logits, coeffs = jax.jit(model.apply)(params, ids)
    cfg, T = model.cfg, ids.shape[1]
    if isinstance(model, v4.DeepseekV4):
        kinds = {"hash_moe": iter(coeffs.get("hash_router", ())),
                 "moe": iter(coeffs.get("router", ()))}
        experts = np.stack([np.asarray(v4.route(cfg, params["layers"][i]["moe"],
                                                next(kinds[kind]), ids)[0])
                            for i, kind in enumerate(cfg.mlp_layer_types)])
        positions = np.arange(T)
        chosen = [np.asarray(v4.index_select(cfg, s, positions)) for s in coeffs["indexer"]]
        visible = [np.asarray(v4.visible_entries(cfg.csa_rate, s.shape[-1], positions))
                   for s in coeffs["indexer"]]
    else:
        experts = np.asarray(llm.selected_experts(cfg, params, coeffs["router"]))
        causal = np.tril(np.ones((T, T), bool))
        chosen = [np.asarray(indexer.select(s, causal, cfg.index_topk))
                  for s in coeffs["indexer"]]
        visible = [causal] * len(chosen)
    # transformers names k entries per query (-1: none; a query that sees fewer than k
    # also names masked ones, which it gives no weight): compare among the visible ones
    same_sel = len(chosen) == len(ref["index"]) and all(
        np.array_equal(c, _selection_rows(r, c.shape[-1]) & v)
        for c, r, v in zip(chosen, ref["index"], visible))
    return {"max_abs_logit_diff": float(np.abs(np.asarray(logits) - ref["logits"]).max()),
            "max_abs_logit": float(np.abs(ref["logits"]).max()),
            "top_k_sets_equal": bool(np.array_equal(np.sort(experts.reshape(
                ref["experts"].shape), -1), np.sort(ref["experts"], -1))),
            "indexer_selections_equal": bool(same_sel),
            "batch": int(ids.shape[0]), "seq_len": int(T),
            "seed": int(ref["seed"]), "index_margin": float(ref["index_margin"]),
            **({"router_margin": float(ref["router_margin"])} if "router_margin" in ref
               else {}),
            "transformers": str(ref["transformers"]), "torch": str(ref["torch"]),
            "made_by": "python scripts/make_deepseek_v4_reference.py"
                       + ("" if out.name == "deepseek_v4" else f" --only {out.name}")}


def check(root: pathlib.Path = ROOT / "tests/data/hf") -> dict:
    """The parity rows of every fixture this script makes (``FIXTURES``), no torch."""
    return {name: parity(root / name) for name in FIXTURES}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/data/deepseek_v4_parts.npz")
    ap.add_argument("--model-out", default="tests/data/hf/deepseek_v4")
    ap.add_argument("--only", default="", help="deepseek_v32: build only that fixture")
    ap.add_argument("--check", action="store_true",
                    help="recompute the committed fixtures' parity rows into --results; "
                         "build nothing (no torch needed)")
    ap.add_argument("--results", default=str(ROOT / "results/hf_parity.json"))
    ap.add_argument("--tokenizers", action="store_true",
                    help="only write each fixture's tokenizer.json (no torch needed)")
    args = ap.parse_args()
    if args.check:
        write_rows(check(), pathlib.Path(args.results))
        return
    if args.tokenizers:
        for name in FIXTURES:
            write_tokenizer(pathlib.Path("tests/data/hf") / name)
        return
    if args.only == "deepseek_v4_fp4":
        print(args.only, build_model(pathlib.Path("tests/data/hf/deepseek_v4_fp4"), FP4_MODEL,
                                     fp4=True))
        return
    if args.only in ("deepseek_v32", "glm_moe_dsa"):
        sizes = V32 if args.only == "deepseek_v32" else GLM5
        print(args.only, build_sparse(args.only, sizes, pathlib.Path("tests/data/hf") / args.only))
        return
    print("model:", build_model(pathlib.Path(args.model_out)))
    arrays = build()
    path = pathlib.Path(args.out)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(path)
    print(f"wrote {path} ({path.stat().st_size} bytes; router margin "
          f"{float(arrays['router.margin']):.3g})")


if __name__ == "__main__":
    main()
