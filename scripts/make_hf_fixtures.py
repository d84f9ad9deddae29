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
from dynjax._alloc import reexec  # noqa: E402  one runtime set-up for every program (dynjax/_alloc.py)
reexec(__name__)
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
}
SHARDED = {"mixtral"}
BATCH, SEQ_LEN = 2, 32
ROUTER_STD = 0.375     # router logits of RMS-normed inputs get std ~3: clear top-k margins
MIN_MARGIN = 1e-3      # smallest k-th minus (k+1)-th router logit accepted (noise ~1e-6)


def train_tokenizer(out: pathlib.Path):
    """A 256-token BPE over the embedded corpus's training text (first 400 kB)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from dynjax.data import text

    corpus = text.load_splits("embedded")["train"][:400_000].tobytes().decode("utf-8", "replace")
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(corpus.splitlines(), trainers.BpeTrainer(
        vocab_size=COMMON["vocab_size"], special_tokens=["[UNK]"], show_progress=False))
    assert tok.get_vocab_size() == COMMON["vocab_size"], tok.get_vocab_size()
    tok.save(str(out))


def margins(router_logits, k):
    """Smallest gap between a token's k-th and (k+1)-th router logit (softmax keeps order)."""
    z = router_logits.float().sort(-1, descending=True).values
    return float((z[:, k - 1] - z[:, k]).min())


def build(arch: str, out: pathlib.Path, tokenizer: pathlib.Path):
    import torch
    import transformers

    from dynjax.loaders import hf

    cfg = transformers.AutoConfig.for_model(arch, **COMMON, **ARCHS[arch])
    cfg._attn_implementation = "eager"
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(tokenizer, out / "tokenizer.json")
    ids = hf.token_windows(str(out), SEQ_LEN, n_calibration=BATCH, n_evaluation=1)["calibration"]
    for seed in range(20):
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
                    p.normal_(0.0, ROUTER_STD)
            res = model(torch.as_tensor(ids, dtype=torch.long), output_router_logits=True)
        routers = [r.reshape(BATCH * SEQ_LEN, -1) for r in (getattr(res, "router_logits", None) or ())]
        k = getattr(cfg, "num_experts_per_tok", 0)
        margin = min((margins(r, k) for r in routers), default=float("inf"))
        if margin > MIN_MARGIN:
            break
    else:
        raise SystemExit(f"{arch}: no seed gave top-k margins above {MIN_MARGIN}")
    for f in out.glob("*.safetensors*"):
        f.unlink()
    model.save_pretrained(out, max_shard_size="200KB" if arch in SHARDED else "50GB")
    (out / "generation_config.json").unlink(missing_ok=True)
    np.savez(out / "reference.npz", input_ids=ids, logits=res.logits.numpy(),
             router_logits=np.stack([r.numpy() for r in routers]) if routers
             else np.zeros((0, BATCH * SEQ_LEN, 0), np.float32),
             seed=seed, top_k_margin=margin, transformers=transformers.__version__,
             torch=torch.__version__)
    return {"seed": seed, "top_k_margin": margin if routers else None,
            "transformers": transformers.__version__, "torch": torch.__version__}


def parity(out: pathlib.Path) -> dict:
    """max |dynjax - transformers| of the logits, and whether every token's top-k experts
    agree, for a fixture directory (jitted float32 forward)."""
    import jax

    from dynjax.loaders import hf

    ref = np.load(out / "reference.npz")
    model, params = hf.load(str(out))
    logits, coeffs = jax.jit(model.apply)(params, ref["input_ids"])
    row = {"max_abs_logit_diff": float(np.abs(np.asarray(logits) - ref["logits"]).max()),
           "max_abs_logit": float(np.abs(ref["logits"]).max())}
    if "router" in coeffs:
        k = model.cfg.top_k
        ours = np.sort(np.asarray(jax.lax.top_k(coeffs["router"], k)[1]), -1)
        theirs = np.sort(np.argsort(-ref["router_logits"], -1)[..., :k], -1)
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
        made = build(arch, out / arch, tokenizer) if rebuild else {}
        if not rebuild:
            ref = np.load(out / arch / "reference.npz")
            made = {"seed": int(ref["seed"]), "top_k_margin": float(ref["top_k_margin"])
                    if ref["router_logits"].size else None,
                    "transformers": str(ref["transformers"]), "torch": str(ref["torch"])}
        table[arch] = {**made, **parity(out / arch)}
        print(arch, table[arch], flush=True)
    tokenizer.unlink(missing_ok=True)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    jsonio.write_json_atomic(args.results, {
        "command": jsonio.command_line(), "batch": BATCH, "seq_len": SEQ_LEN,
        "dtype": "float32", "fixture_bytes": size, "architectures": table})
    print(f"fixtures: {size / 1e6:.2f} MB in {out}; parity table: {args.results}")


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
