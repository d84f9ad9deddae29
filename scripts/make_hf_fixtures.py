"""Build the tiny random Hugging Face checkpoints the parity tests read (tests/data/hf/).

    pip install -e '.[hf]'          # torch (CPU) + transformers: this script only
    python scripts/make_hf_fixtures.py [--out=tests/data/hf] [--results=results/hf_parity.json]
    python scripts/make_hf_fixtures.py --check     # parity of the committed fixtures only (no torch)
    python scripts/make_hf_fixtures.py --only=qwen2,mistral   # build these, keep the others

For every ported architecture: a random checkpoint from transformers itself (2-4 layers,
d = 48, grouped-query attention, 8 experts, top-2 or top-4), saved with save_pretrained
(Mixtral's sharded, to exercise model.safetensors.index.json), the one BPE tokenizer.json
this script trains on dynjax's embedded corpus, and ``reference.npz``: the input windows
(from ``dynjax.loaders.hf.token_windows``), transformers' eager float32 logits and each MoE
layer's router logits. Router weights are scaled so that every token's k-th and (k+1)-th
router logit differ by far more than float noise (the script refuses otherwise), so
the selected expert sets are a property of the model, not of rounding.

Then it loads each fixture with ``dynjax.loaders.hf.load`` and writes the parity table,
max |logit difference| per architecture, with this command line, to ``--results``.
"""
from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402

import numpy as np  # noqa: E402

COMMON = dict(vocab_size=256, hidden_size=48, num_attention_heads=4, num_key_value_heads=2,
              head_dim=12, initializer_range=0.08, rms_norm_eps=1e-6,
              max_position_embeddings=256, bos_token_id=None,
              eos_token_id=None, pad_token_id=None)
ARCHS = {
    # Llama 3.1-style rotary scaling, small enough that all three frequency bands occur
    "llama": dict(num_hidden_layers=2, intermediate_size=96, attention_bias=True,
                  rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                       low_freq_factor=1.0, high_freq_factor=4.0,
                                       original_max_position_embeddings=64)),
    "qwen2": dict(num_hidden_layers=2, intermediate_size=96, use_sliding_window=False,
                  rope_parameters=dict(rope_type="default", rope_theta=1e6)),
    "mistral": dict(num_hidden_layers=2, intermediate_size=96, sliding_window=None,
                    rope_parameters=dict(rope_type="default", rope_theta=1e6)),
    "qwen3": dict(num_hidden_layers=2, intermediate_size=96, tie_word_embeddings=True,
                  rope_parameters=dict(rope_type="default", rope_theta=1e6)),
    "mixtral": dict(num_hidden_layers=2, intermediate_size=24, num_local_experts=8,
                    num_experts_per_tok=2, sliding_window=None,
                    rope_parameters=dict(rope_type="default", rope_theta=1e6)),
    "olmoe": dict(num_hidden_layers=2, intermediate_size=16, num_experts=8,
                  num_experts_per_tok=4, norm_topk_prob=True, clip_qkv=2.0,
                  rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
    "qwen2_moe": dict(num_hidden_layers=3, intermediate_size=48, moe_intermediate_size=16,
                      shared_expert_intermediate_size=32, num_experts=8,
                      num_experts_per_tok=2, norm_topk_prob=False, mlp_only_layers=[1],
                      decoder_sparse_step=1, rope_parameters=dict(rope_type="default",
                                                                  rope_theta=10000.0)),
    "qwen3_moe": dict(num_hidden_layers=4, intermediate_size=48, moe_intermediate_size=16,
                      num_experts=8, num_experts_per_tok=4, norm_topk_prob=True,
                      decoder_sparse_step=2, rope_parameters=dict(rope_type="default",
                                                                  rope_theta=1e6)),
    # DeepSeek-V3: q-LoRA, 4 groups of 2 experts (2 kept), YaRN whose two mscales differ (so
    # both the cos/sin factor and the softmax scale's mscale^2 are exercised), 1 dense layer
    "deepseek_v3": dict(num_hidden_layers=3, intermediate_size=64, moe_intermediate_size=16,
                        num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                        qk_nope_head_dim=8, qk_rope_head_dim=8, head_dim=8, v_head_dim=8,
                        n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
                        n_shared_experts=1, first_k_dense_replace=1, norm_topk_prob=True,
                        routed_scaling_factor=2.5, rope_interleave=True,
                        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                             original_max_position_embeddings=64,
                                             beta_fast=32.0, beta_slow=1.0, mscale=1.0,
                                             mscale_all_dim=0.8)),
    # DeepSeek-V3 without q-LoRA (one q_proj) and without groups, rotate-half pairs
    "deepseek_v3_plain": dict(model_type="deepseek_v3", num_hidden_layers=2,
                              intermediate_size=64, moe_intermediate_size=16,
                              num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16,
                              qk_nope_head_dim=8, qk_rope_head_dim=8, head_dim=8, v_head_dim=8,
                              n_routed_experts=8, num_experts_per_tok=2, n_group=1,
                              topk_group=1, n_shared_experts=2, first_k_dense_replace=0,
                              norm_topk_prob=False, routed_scaling_factor=1.5,
                              rope_interleave=False,
                              rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
    # DeepSeek-V2(-Lite): softmax router, group_limited_greedy, YaRN with equal mscales
    "deepseek_v2": dict(num_hidden_layers=3, intermediate_size=64, moe_intermediate_size=16,
                        num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=16,
                        qk_nope_head_dim=8, qk_rope_head_dim=8, head_dim=8, v_head_dim=8,
                        n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
                        topk_method="group_limited_greedy", n_shared_experts=2,
                        first_k_dense_replace=1, routed_scaling_factor=2.0,
                        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                             original_max_position_embeddings=64,
                                             mscale=0.707, mscale_all_dim=0.707)),
    # GLM-4.5: heads x head_dim (64) wider than hidden (48), half of each head rotates,
    # q/k/v biases and per-head q/k norm, the sigmoid router with its bias, no groups
    "glm4_moe": dict(num_hidden_layers=3, intermediate_size=64, moe_intermediate_size=16,
                     head_dim=16, attention_bias=True, use_qk_norm=True,
                     partial_rotary_factor=0.5, n_routed_experts=8, num_experts_per_tok=2,
                     n_group=1, topk_group=1, n_shared_experts=1, first_k_dense_replace=1,
                     norm_topk_prob=True, routed_scaling_factor=2.5,
                     rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                          partial_rotary_factor=0.5)),
    # GLM-4.7-Flash: MLA (q-LoRA, interleaved pairs) with GLM's router; layer 1 dense by
    # mlp_layer_types
    "glm4_moe_lite": dict(num_hidden_layers=3, intermediate_size=64, moe_intermediate_size=16,
                          num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                          qk_nope_head_dim=8, qk_rope_head_dim=8, head_dim=8, v_head_dim=8,
                          n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1,
                          n_shared_experts=1, mlp_layer_types=["sparse", "dense", "sparse"],
                          norm_topk_prob=True, routed_scaling_factor=1.8,
                          rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
    # the production rotary (YaRN, truncate=False); a window of 8 of the 32 tokens on layer 0;
    # swiglu_limit 0.5 clamps a share of the expert activations (gpt_oss_tweak: sinks, biases)
    "gpt_oss": dict(num_hidden_layers=2, intermediate_size=16, num_local_experts=8,
                    num_experts_per_tok=4, sliding_window=8, swiglu_limit=0.5,
                    layer_types=["sliding_attention", "full_attention"],
                    rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0,
                                         beta_fast=32.0, beta_slow=1.0, truncate=False,
                                         original_max_position_embeddings=4096)),
}
SHARDED = {"mixtral"}
GROUPED = {"deepseek_v3": "sigmoid", "glm4_moe": "sigmoid", "glm4_moe_lite": "sigmoid",
           "deepseek_v2": "softmax"}
BATCH, SEQ_LEN = 2, 32
ROUTER_STD = 0.375     # router logits of RMS-normed inputs get std ~3: clear top-k margins
MIN_MARGIN = 1e-3      # smallest k-th minus (k+1)-th router logit accepted (noise ~1e-6)
BIAS_STD = 0.15        # DeepSeek-V3's e_score_correction_bias: moves some tokens' selection
ROUTERS = ("mlp.gate.weight", "block_sparse_moe.gate.weight", "mlp.router.weight")


def gpt_oss_tweak(model, torch):
    """Attention sinks N(1, 1.5) (transformers' init, N(0, 0.08) here, would barely matter),
    every bias N(0, 0.3) (they start at 0), the router bias N(0, 1)."""
    for name, p in model.named_parameters():
        if name.endswith("sinks"):
            p.normal_(1.0, 1.5)
        elif name.endswith("router.bias"):
            p.normal_(0.0, 1.0)
        elif name.endswith("bias"):
            p.normal_(0.0, 0.3)


TWEAKS = {"gpt_oss": gpt_oss_tweak}
# gpt-oss with its experts in MXFP4, as the Hub ships them (groups of 32 input channels,
# so wider than COMMON's 48); its own random tokens (no tokenizer)
MXFP4 = dict(vocab_size=64, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
             num_hidden_layers=2, sliding_window=4, swiglu_limit=1.0, initializer_range=0.08,
             layer_types=["sliding_attention", "full_attention"], rms_norm_eps=1e-5,
             max_position_embeddings=256, bos_token_id=None, eos_token_id=None,
             pad_token_id=None, rope_parameters=ARCHS["gpt_oss"]["rope_parameters"])
VARIANTS = {"gpt_oss_mxfp4": "gpt_oss"}   # built with (and after) their architecture


def train_tokenizer(out: pathlib.Path, vocab_size: int = COMMON["vocab_size"]):
    """A ``vocab_size``-token BPE (256 by default) over the embedded corpus's training text
    (first 400 kB); a small vocabulary keeps the most frequent characters as its alphabet
    (the rest become [UNK])."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from dynjax.data import text

    corpus = text.load_splits("embedded")["train"][:400_000].tobytes().decode("utf-8", "replace")
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(corpus.splitlines(), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["[UNK]"], show_progress=False,
        **({"limit_alphabet": vocab_size - 16} if vocab_size < COMMON["vocab_size"] else {})))
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    tok.save(str(out))


def save_checkpoint(model, out: pathlib.Path, **kwargs):
    """``model.save_pretrained`` into ``out`` in place of an earlier build's shards, without
    the generation_config.json transformers adds (a fixture carries none)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("*.safetensors*"):
        f.unlink()
    model.save_pretrained(out, **kwargs)
    (out / "generation_config.json").unlink(missing_ok=True)


def margins(router_logits, k):
    """Smallest gap between a token's k-th and (k+1)-th router logit (softmax keeps order)."""
    z = router_logits.float().sort(-1, descending=True).values
    return float((z[:, k - 1] - z[:, k]).min())


def selection_margin(cfg, logits, bias):
    """DeepSeek-style routers (transformers' rule, recomputed in torch from the captured
    logits; sigmoid scores, or log-softmax ones, whose gaps are the logits'): the smaller of the topk_group-th vs next group-score gap and the k-th vs
    (k+1)-th gap of the eligible selection scores; and on how many tokens the bias moved
    the selection off the unbiased top-k."""
    import torch

    k, E = cfg.num_experts_per_tok, logits.shape[-1]
    sigmoid = GROUPED[cfg.model_type] == "sigmoid"
    # softmax keeps the logits' order (and their gaps in log space): margins in logits
    scores = logits.sigmoid() if sigmoid else logits.log_softmax(-1)
    choice = scores + bias if bias is not None else scores
    G = cfg.n_group or 1
    margin = float("inf")
    if G > 1 and cfg.topk_group < G:
        grouped = choice.view(-1, G, E // G)
        group = grouped.topk(2, -1)[0].sum(-1) if sigmoid else grouped.max(-1).values
        g = group.sort(-1, descending=True).values
        margin = float((g[:, cfg.topk_group - 1] - g[:, cfg.topk_group]).min())
        keep = torch.zeros_like(group).scatter_(1, group.topk(cfg.topk_group, -1)[1], 1)
        choice = choice.masked_fill(~keep.repeat_interleave(E // G, -1).bool(), float("-inf"))
    z = choice.sort(-1, descending=True).values
    margin = min(margin, float((z[:, k - 1] - z[:, k]).min()))
    picked = choice.topk(k, -1)[1].sort(-1).values
    moved = int((picked != scores.topk(k, -1)[1].sort(-1).values).any(-1).sum())
    return margin, moved


def random_model(cfg, seed: int, tweak=None):
    """transformers' random model of ``cfg`` at ``seed``, router weights N(0, ROUTER_STD),
    DeepSeek's e_score_correction_bias N(0, BIAS_STD), then ``tweak(model, torch)``."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(ROUTERS):
                p.normal_(0.0, ROUTER_STD)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, BIAS_STD)
        if tweak is not None:
            tweak(model, torch)
    return model


def build(arch: str, out: pathlib.Path, tokenizer: pathlib.Path):
    import torch
    import transformers

    from dynjax.loaders import hf

    spec = dict(ARCHS[arch])
    model_type = spec.pop("model_type", arch)
    cfg = transformers.AutoConfig.for_model(model_type, **{**COMMON, **spec})
    cfg._attn_implementation = "eager"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(tokenizer, out / "tokenizer.json")
    ids = hf.token_windows(str(out), SEQ_LEN, n_calibration=BATCH, n_evaluation=1)["calibration"]
    for seed in range(60):
        model = random_model(cfg, seed, TWEAKS.get(arch))
        grouped = model_type in GROUPED
        picks, captured, biases = [], [], []

        def keep(module, inputs, out):   # (logits, weights, experts); returns None
            captured.append(out[0])
            picks.append(out[2])
        if grouped:
            for name, m in model.named_modules():
                if name.endswith("mlp.gate"):
                    biases.append(getattr(m, "e_score_correction_bias", None))
                    m.register_forward_hook(keep)
        with torch.no_grad():
            res = model(torch.as_tensor(ids, dtype=torch.long), output_router_logits=True)
        routers = [r.reshape(BATCH * SEQ_LEN, -1) for r in
                   (captured or getattr(res, "router_logits", None) or ())]
        k = getattr(cfg, "num_experts_per_tok", 0)
        moved = 0
        if grouped:
            found = [selection_margin(cfg, r, b) for r, b in zip(routers, biases)]
            margin, moved = min(f[0] for f in found), sum(f[1] for f in found)
        else:
            margin = min((margins(r, k) for r in routers), default=float("inf"))
        if margin > MIN_MARGIN and (moved > 0 or not any(b is not None for b in biases)):
            break
    else:
        raise SystemExit(f"{arch}: no seed gave top-k margins above {MIN_MARGIN}")
    save_checkpoint(model, out, max_shard_size="200KB" if arch in SHARDED else "50GB")
    extra = {"router_experts": np.stack([np.sort(p.numpy(), -1) for p in picks]),
             "bias_moved_tokens": moved} if picks else {}
    np.savez(out / "reference.npz", input_ids=ids, logits=res.logits.numpy(),
             router_logits=np.stack([r.numpy() for r in routers]) if routers
             else np.zeros((0, BATCH * SEQ_LEN, 0), np.float32),
             seed=seed, top_k_margin=margin, transformers=transformers.__version__,
             torch=torch.__version__, **extra)
    return {"seed": seed, "top_k_margin": margin if routers else None,
            "transformers": transformers.__version__, "torch": torch.__version__,
            **({"bias_moved_tokens": moved} if picks and biases[0] is not None else {})}


def quantize_mxfp4(w):
    """(blocks uint8 (E, R, C/32, 16), scales uint8 (E, R, C/32)) of w (E, R, C): per group of
    32 along C, the power-of-two scale 2^ceil(log2(amax / 6)) (e8m0, byte = exponent + 127)
    and each value rounded to the nearest e2m1 (+-{0, .5, 1, 1.5, 2, 3, 4, 6}), two per byte,
    the even one in the low nibble."""
    from dynjax.loaders.tensors import FP4_E2M1

    E, R, C = w.shape
    g = w.reshape(E, R, C // 32, 32).astype(np.float32)
    amax = np.maximum(np.abs(g).max(-1, keepdims=True), 1e-30)
    exp = np.ceil(np.log2(amax / 6.0)).astype(np.int32)
    q = g / np.exp2(exp)
    codes = np.abs(q[..., None] - FP4_E2M1).argmin(-1).astype(np.uint8)   # nearest, signed
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return blocks, (exp[..., 0] + 127).astype(np.uint8)


def build_mxfp4(out: pathlib.Path):
    """A random gpt-oss whose experts are quantized to MXFP4 here, and transformers' logits
    after ``from_pretrained`` dequantizes them (``Mxfp4Config(dequantize=True)``, float32)."""
    import json

    import torch
    import transformers
    from safetensors.numpy import load_file, save_file

    cfg = transformers.AutoConfig.for_model("gpt_oss", **MXFP4)
    cfg._attn_implementation = "eager"
    out.mkdir(parents=True, exist_ok=True)
    ids = np.random.default_rng(0).integers(0, MXFP4["vocab_size"], (BATCH, 16)).astype(np.int32)
    for seed in range(20):
        model = random_model(cfg, seed, gpt_oss_tweak)
        for f in out.glob("*.safetensors*"):
            f.unlink()
        model.save_pretrained(out)
        tensors = load_file(out / "model.safetensors")
        for name in [n for n in tensors if n.endswith(("gate_up_proj", "down_proj"))]:
            w = tensors.pop(name)      # (E, in, out) -> the Hub's (E, out, in) groups
            tensors[name + "_blocks"], tensors[name + "_scales"] = quantize_mxfp4(
                np.ascontiguousarray(w.transpose(0, 2, 1)))
        save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
        config = json.loads((out / "config.json").read_text())
        config["quantization_config"] = {"quant_method": "mxfp4"}
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        ref = transformers.AutoModelForCausalLM.from_pretrained(
            out, dtype=torch.float32, attn_implementation="eager",
            quantization_config=transformers.Mxfp4Config(dequantize=True)).eval()
        with torch.no_grad():
            res = ref(torch.as_tensor(ids, dtype=torch.long), output_router_logits=True)
        routers = [r.reshape(BATCH * ids.shape[1], -1) for r in res.router_logits]
        margin = min(margins(r, MXFP4["num_experts_per_tok"]) for r in routers)
        if margin > MIN_MARGIN:
            break
    else:
        raise SystemExit(f"{out.name}: no seed gave top-k margins above {MIN_MARGIN}")
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").unlink(missing_ok=True)
    (out / "model.safetensors").chmod(0o644)
    np.savez(out / "reference.npz", input_ids=ids, logits=res.logits.numpy(),
             router_logits=np.stack([r.numpy() for r in routers]), seed=seed,
             top_k_margin=margin, transformers=transformers.__version__,
             torch=torch.__version__)
    return {"seed": seed, "top_k_margin": margin, "transformers": transformers.__version__,
            "torch": torch.__version__}


def recorded(out: pathlib.Path) -> dict:
    """What reference.npz says of how a committed fixture was made."""
    ref = np.load(out / "reference.npz")
    made = {"seed": int(ref["seed"]), "top_k_margin": float(ref["top_k_margin"])
            if ref["router_logits"].size else None,
            "transformers": str(ref["transformers"]), "torch": str(ref["torch"])}
    if "bias_moved_tokens" in ref and out.name != "deepseek_v2":
        made["bias_moved_tokens"] = int(ref["bias_moved_tokens"])
    return made


def parity(out: pathlib.Path) -> dict:
    """max |dynjax - transformers| of the logits, and whether every token's top-k experts
    agree, for a fixture directory (jitted float32 forward)."""
    import jax

    from dynjax.loaders import hf
    from dynjax.models import llm

    ref = np.load(out / "reference.npz")
    model, params = hf.load(str(out))
    logits, coeffs = jax.jit(model.apply)(params, ref["input_ids"])
    row = {"max_abs_logit_diff": float(np.abs(np.asarray(logits) - ref["logits"]).max()),
           "max_abs_logit": float(np.abs(ref["logits"]).max())}
    if "router" in coeffs:
        ours = np.sort(np.asarray(llm.selected_experts(model.cfg, params, coeffs["router"])), -1)
        if "router_experts" in ref:     # the router's own picks (selection != top-k scores)
            theirs = ref["router_experts"]
        else:
            theirs = np.sort(np.argsort(-ref["router_logits"], -1)[..., :model.cfg.top_k], -1)
        row["top_k_sets_equal"] = bool((ours.reshape(theirs.shape) == theirs).all())
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "tests/data/hf"))
    ap.add_argument("--results", default=str(ROOT / "results/hf_parity.json"))
    ap.add_argument("--check", action="store_true",
                    help="recompute the parity table of the fixtures in --out; build nothing")
    ap.add_argument("--only", default="",
                    help="comma-separated architectures to build (the others are kept and "
                         "checked; the tokenizer is the committed one)")
    args = ap.parse_args()
    only = [a for a in args.only.split(",") if a]
    unknown = sorted(set(only) - set(ARCHS))
    if unknown:
        raise SystemExit(f"--only names {unknown}; choose from {sorted(ARCHS)}")
    from dynjax import jsonio

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = out / "tokenizer.json"
    if only:
        shutil.copy(out / "llama" / "tokenizer.json", tokenizer)
    elif not args.check:
        train_tokenizer(tokenizer)
    table = {}
    for arch in ARCHS:
        rebuild = not args.check and (not only or arch in only)
        made = build(arch, out / arch, tokenizer) if rebuild else recorded(out / arch)
        table[arch] = {**made, **parity(out / arch)}
        print(arch, table[arch], flush=True)
    for name, arch in VARIANTS.items():
        rebuild = not args.check and (not only or arch in only)
        made = build_mxfp4(out / name) if rebuild else recorded(out / name)
        table[name] = {**made, **parity(out / name)}
        print(name, table[name], flush=True)
    import make_deepseek_v4_reference as sparse   # its fixtures' rows (checked, not built)
    import make_hf_hybrid_fixtures as hybrid       # Qwen3-Next / Qwen3.5 rows, likewise
    table.update(sparse.check(out))
    table.update(hybrid.check(out))
    tokenizer.unlink(missing_ok=True)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    jsonio.write_json_atomic(args.results, {
        "command": jsonio.command_line(), "batch": BATCH, "seq_len": SEQ_LEN,
        "dtype": "float32", "fixture_bytes": size, "architectures": table})
    print(f"fixtures: {size / 1e6:.2f} MB in {out}; parity table: {args.results}")


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
