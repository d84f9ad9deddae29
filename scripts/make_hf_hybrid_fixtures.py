"""Build the tiny random Qwen3-Next, Qwen3.5-MoE, Qwen3.5 and Gemma-4 checkpoints (tests/data/hf/).

    pip install -e '.[hf]'          # torch (CPU) + transformers: this script only
    python scripts/make_hf_hybrid_fixtures.py [--only=qwen3_next] [--out=tests/data/hf]
    python scripts/make_hf_hybrid_fixtures.py --check   # parity of the committed ones (no torch)

The hybrid architectures beside scripts/make_hf_fixtures.py's (whose conventions, sizes,
tokenizer and ``reference.npz`` format they share): three Gated DeltaNet layers, then a
gated full-attention layer (``layer_types``), softmax top-k MoE with a shared expert behind
a sigmoid gate (``qwen3_5``: a dense SwiGLU MLP instead), norms with gain 1 + w, partial
rotary. ``qwen3_5_moe`` and ``qwen3_5`` are saved as the shipped checkpoints are: the
multimodal wrapper (text under ``model.language_model.``, a one-block vision tower under
``model.visual.``) plus multi-token-prediction tensors
(``mtp.*``) that a text forward must skip. Weights are drawn where every coefficient
matters: router margins far above float noise (as make_hf_fixtures.py's), attention and
shared-expert gates spread over (0, 1), DeltaNet decays from near 1 to near 0, norm gains
away from 1. ``reference.npz`` adds each DeltaNet layer's beta and decay
(``deltanet_beta``, ``deltanet_decay``) to transformers' logits and router logits.
``gemma4`` (Gemma-4's text model in its multimodal wrapper, a one-layer vision tower beside
it): a sliding-window layer (window 8 of the 32 tokens) then a full-attention one with its
own head width, one KV head and K = V; every layer an MoE beside a dense MLP; norm gains,
router scales, per-expert scales and layer scalars drawn away from 1, router logits with
clear margins (captured from ``router.proj``: transformers records the probabilities), a
final logit soft-cap of 4 that bends the larger logits.
Their parity rows (make_hf_fixtures.py's ``parity``: max |dlogit|, top-k sets) go into
``--results`` (results/hf_parity.json, beside every other port's; make_hf_fixtures.py
--check recomputes them with the rest).
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

sys.path.insert(0, str(ROOT / "scripts"))
import make_hf_fixtures as base  # noqa: E402  the shared sizes, margins and windows

LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
              linear_value_head_dim=8, linear_conv_kernel_dim=4)
LAYER_TYPES = ["linear_attention"] * 3 + ["full_attention"]
ROPE = dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5)
ARCHS = {
    "qwen3_next": dict(num_hidden_layers=4, layer_types=LAYER_TYPES, intermediate_size=48,
                       moe_intermediate_size=8, shared_expert_intermediate_size=16,
                       num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                       decoder_sparse_step=1, mlp_only_layers=[1], rope_parameters=ROPE,
                       **LINEAR),
    "qwen3_5_moe": dict(num_hidden_layers=4, layer_types=LAYER_TYPES,
                        moe_intermediate_size=8, shared_expert_intermediate_size=16,
                        num_experts=8, num_experts_per_tok=2,
                        rope_parameters=dict(ROPE, mrope_section=[1, 1, 1],
                                             mrope_interleaved=True), **LINEAR),
    "qwen3_5": dict(num_hidden_layers=4, layer_types=LAYER_TYPES, intermediate_size=48,
                    rope_parameters=dict(ROPE, mrope_section=[1, 1, 1],
                                         mrope_interleaved=True), **LINEAR),
    "gemma4": dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                   num_key_value_heads=2, head_dim=16, global_head_dim=32,
                   num_global_key_value_heads=1, attention_k_eq_v=True, intermediate_size=16,
                   enable_moe_block=True, num_experts=8, top_k_experts=2,
                   moe_intermediate_size=8, hidden_size_per_layer_input=0,
                   sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                   final_logit_softcapping=4.0, tie_word_embeddings=True, pad_token_id=0),
}
WRAPPED = ("qwen3_5_moe", "qwen3_5", "gemma4")   # shipped as the multimodal wrapper
MTP_ARCHS = ("qwen3_5_moe", "qwen3_5")          # ... with MTP tensors
VISION = dict(depth=1, hidden_size=16, num_heads=2, intermediate_size=32, patch_size=4,
              temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=48,
              num_position_embeddings=16)
GEMMA4_VISION = dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2, head_dim=4, patch_size=4,
                     position_embedding_size=16)
MTP = {"mtp.fc.weight": (48, 96), "mtp.norm.weight": (48,),
       "mtp.layers.0.input_layernorm.weight": (48,)}


def make_config(arch: str):
    import transformers

    common = {k: v for k, v in base.COMMON.items() if k != "intermediate_size"}
    if arch == "gemma4":
        cfg = transformers.AutoConfig.for_model(
            arch, text_config=dict(common, **ARCHS[arch]), vision_config=GEMMA4_VISION,
            audio_config=None, tie_word_embeddings=True)
    elif arch in WRAPPED:
        text = dict(common, **ARCHS[arch])
        cfg = transformers.AutoConfig.for_model(arch, text_config=text, vision_config=VISION,
                                                tie_word_embeddings=False)
    else:
        cfg = transformers.AutoConfig.for_model(arch, **common, **ARCHS[arch])
    cfg._attn_implementation = "eager"
    return cfg


def draw(model):
    """Weights at scales where each coefficient and gain matters (see the docstring)."""
    import torch
    if type(model).__name__.startswith("Gemma4"):
        return draw_gemma4(model, torch)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "visual" in name:
                continue
            if name.endswith("mlp.gate.weight"):
                p.normal_(0.0, base.ROUTER_STD)
            elif name.endswith("shared_expert_gate.weight"):
                p.normal_(0.0, 0.3)
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(0.05, 4.0)))
            elif name.endswith("dt_bias"):
                p.normal_(0.0, 1.0)
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif name.endswith("norm.weight"):          # the (1 + w) norms
                p.normal_(0.0, 0.3)
            elif name.endswith("conv1d.weight"):
                p.normal_(0.0, 0.5)
            elif name.endswith("self_attn.q_proj.weight"):
                p.normal_(0.0, 0.15)                    # the gate half spans (0, 1)


def draw_gemma4(model, torch):
    """Gemma-4's text model: norm gains (w itself), the router's scale, the per-expert scales
    and the layer scalars (a saved buffer) away from 1; router logits of std ~3 (its input is
    RMS-normed and times D^-1/2, so the weight's std is the logits')."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "language_model" not in name:
                continue
            if name.endswith("router.proj.weight"):
                p.normal_(0.0, 3.0)
            elif name.endswith("per_expert_scale"):
                p.uniform_(0.5, 2.0)
            elif name.endswith("router.scale") or "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.uniform_(0.5, 1.5)


def capture_coefficients(model):
    """Hooks recording each DeltaNet layer's beta and decay as transformers computes them
    (Gemma-4: each router's logits, ``router_logits``)."""
    import torch.nn.functional as F
    if type(model).__name__.startswith("Gemma4"):
        logits = []
        for name, m in model.named_modules():
            if name.endswith("router.proj"):
                m.register_forward_hook(lambda mod, args, out: logits.append(
                    out.detach().float().numpy()))
        return {"router_logits": logits}
    found = {"deltanet_beta": [], "deltanet_decay": []}

    def hook(module, args, kwargs, _out):
        x = kwargs.get("hidden_states", args[0] if args else None)
        if hasattr(module, "in_proj_ba"):
            _, _, _, _, b, a = module.fix_query_key_value_ordering(
                module.in_proj_qkvz(x), module.in_proj_ba(x))
        else:
            b, a = module.in_proj_b(x), module.in_proj_a(x)
        found["deltanet_beta"].append(b.sigmoid().float().numpy())
        found["deltanet_decay"].append(
            (-module.A_log.float().exp() * F.softplus(a.float() + module.dt_bias)).numpy())
    for m in model.modules():
        if type(m).__name__.endswith("GatedDeltaNet"):
            m.register_forward_hook(hook, with_kwargs=True)
    return found


def add_mtp_tensors(out: pathlib.Path):
    """The shipped checkpoints' multi-token-prediction block, which the text forward skips."""
    from safetensors.numpy import load_file, save_file
    path = out / "model.safetensors"
    tensors = load_file(path)
    rng = np.random.default_rng(0)
    tensors.update({k: rng.normal(size=s).astype(np.float32) for k, s in MTP.items()})
    save_file(tensors, path, metadata={"format": "pt"})


def build(arch: str, out: pathlib.Path, tokenizer: pathlib.Path) -> dict:
    import torch
    import transformers

    from dynjax.loaders import hf

    cfg = make_config(arch)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(tokenizer, out / "tokenizer.json")
    ids = hf.token_windows(str(out), base.SEQ_LEN, n_calibration=base.BATCH,
                           n_evaluation=1)["calibration"]
    cls = (transformers.AutoModelForImageTextToText if arch in WRAPPED
           else transformers.AutoModelForCausalLM)
    for seed in range(20):
        torch.manual_seed(seed)
        model = cls.from_config(cfg).eval()
        draw(model)
        coeffs = capture_coefficients(model)
        with torch.no_grad():
            res = model(input_ids=torch.as_tensor(ids, dtype=torch.long),
                        **({"output_router_logits": True} if "num_experts" in ARCHS[arch]
                           and arch != "gemma4" else {}))
        routers = [torch.as_tensor(r).reshape(base.BATCH * base.SEQ_LEN, -1) for r in
                   coeffs.pop("router_logits", None) or getattr(res, "router_logits", None)
                   or ()]
        k = ARCHS[arch].get("num_experts_per_tok", ARCHS[arch].get("top_k_experts", 0))
        margin = min((base.margins(r, k) for r in routers), default=float("inf"))
        if margin > base.MIN_MARGIN:
            break
    else:
        raise SystemExit(f"{arch}: no seed gave top-k margins above {base.MIN_MARGIN}")
    base.save_checkpoint(model, out)
    if arch in MTP_ARCHS:
        add_mtp_tensors(out)
    np.savez(out / "reference.npz", input_ids=ids, logits=res.logits.float().numpy(),
             **({"router_logits": np.stack([r.numpy() for r in routers])} if routers else {}),
             **{k: np.stack(v) for k, v in coeffs.items()},
             seed=seed, top_k_margin=margin, transformers=transformers.__version__,
             torch=torch.__version__)
    return {"seed": seed, **({"top_k_margin": margin} if routers else {})}


def check(root: pathlib.Path = ROOT / "tests/data/hf") -> dict:
    """The parity rows of the committed hybrid fixtures (no torch): what the build
    recorded (seed, router margin, versions, bytes) and make_hf_fixtures.py's ``parity``."""
    rows = {}
    for arch in ARCHS:
        ref = np.load(root / arch / "reference.npz")
        margin = float(ref["top_k_margin"])
        rows[arch] = {"seed": int(ref["seed"]),
                      **({"top_k_margin": margin} if np.isfinite(margin) else {}),
                      "transformers": str(ref["transformers"]), "torch": str(ref["torch"]),
                      "bytes": sum(f.stat().st_size for f in (root / arch).iterdir()),
                      **base.parity(root / arch)}
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "tests/data/hf"))
    ap.add_argument("--only", default=",".join(ARCHS))
    ap.add_argument("--check", action="store_true", help="build nothing; parity only")
    ap.add_argument("--results", default=str(ROOT / "results/hf_parity.json"))
    args = ap.parse_args()
    import make_deepseek_v4_reference as sparse   # write_rows: one parity file for every port

    out = pathlib.Path(args.out)
    tokenizer = ROOT / "tests/data/hf/llama/tokenizer.json"   # make_hf_fixtures.py trained it
    if not args.check:
        for arch in args.only.split(","):
            print(arch, build(arch, out / arch, tokenizer), flush=True)
    sparse.write_rows(check(out), pathlib.Path(args.results),
                      "python scripts/make_hf_hybrid_fixtures.py --check")


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
