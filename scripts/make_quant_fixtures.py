"""Build the quantized fixtures the dequantisation tests read (tests/data/hf_quant/).

    pip install -e '.[hf]'          # torch (CPU) + transformers: this script only
    python scripts/make_quant_fixtures.py [--out=tests/data/hf_quant]

Two things, each with transformers' own dequantisation as the reference:

- ``tensors.safetensors`` + ``tensors_reference.npz``: block-FP8 weights as DeepSeek-V3 and
  Kimi-K2 ship them (``e4m3`` with ``weight_scale_inv`` per 128 x 128 block; one with
  ``e8m0`` scales, one whose rows and columns are not multiples of 128) and MXFP4 experts as
  gpt-oss ships them (``mlp.experts.gate_up_proj_blocks`` / ``_scales``, ``down_proj``).
  The references are ``Fp8Dequantize._dequantize_one`` (what ``from_pretrained`` runs with
  ``dequantize=True``), ``_dequantize_fp8_weight`` for the short last block (the load-time op
  requires whole blocks) and ``convert_moe_packed_tensors``, in float32 and bfloat16.
- ``llama_fp8/``: a tiny random Llama whose every projection is block FP8 (32 x 32 blocks;
  layer 0 float32 scales, layer 1 e8m0), with ``quantization_config`` as DeepSeek-V3's, and
  ``reference.npz``: transformers' float32 logits after loading the weights that
  ``Fp8Dequantize`` produces (transformers' FP8 ``from_pretrained`` path needs accelerate,
  which the ``hf`` extra does not install; this is the op it runs).
"""
from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402

FP8_MAX = 448.0
LLAMA = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
             initializer_range=0.08, max_position_embeddings=128, bos_token_id=None,
             eos_token_id=None, pad_token_id=None, tie_word_embeddings=False,
             rope_parameters=dict(rope_type="default", rope_theta=10000.0))
LLAMA_BLOCK = (32, 32)


def quantize_fp8(w, block, e8m0: bool):
    """(e4m3 weight, per-block scale) with w ~= weight * scale, as DeepSeek's fp8 cast does
    (amax / 448 per block; e8m0: the scale rounded up to a power of two)."""
    import torch

    N, K = w.shape
    bn, bk = block
    sn, sk = -(-N // bn), -(-K // bk)
    pad = torch.zeros(sn * bn, sk * bk, dtype=torch.float32)
    pad[:N, :K] = w
    amax = pad.reshape(sn, bn, sk, bk).abs().amax(dim=(1, 3)).clamp(min=1e-8)
    scale = amax / FP8_MAX
    if e8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    full = scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[:N, :K]
    q = (w / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, (scale.to(torch.float8_e8m0fnu) if e8m0 else scale.contiguous())


def tensors(out: pathlib.Path):
    import torch
    from safetensors.torch import save_file
    from transformers.integrations import finegrained_fp8 as tf8
    from transformers.integrations import mxfp4 as tmx

    g = torch.Generator().manual_seed(0)
    deq = tf8.Fp8Dequantize(None)
    save, ref = {}, {}
    # a 128x128-block weight with e8m0 scales (DeepSeek-V3.1's scale_fmt=ue8m0), 1 x 3 grid
    w, s = quantize_fp8(torch.randn(128, 384, generator=g) * 0.05, (128, 128), e8m0=True)
    save["model.layers.0.self_attn.o_proj.weight"] = w
    save["model.layers.0.self_attn.o_proj.weight_scale_inv"] = s
    ref["fp8_e8m0"] = deq._dequantize_one(w, s, output_dtype=torch.float32).numpy()
    # float32 scales, 200 x 72: the last row block is 72 rows, the only column block 72
    w, s = quantize_fp8(torch.randn(200, 72, generator=g) * 0.05, (128, 128), e8m0=False)
    save["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"] = w
    save["model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv"] = s
    ref["fp8_short_block"] = tf8._dequantize_fp8_weight(w, s, [128, 128], torch.float32).numpy()
    # MXFP4 experts, gpt-oss's layout: (E, rows, groups, 16 bytes), scales (E, rows, groups)
    E, D, I = 2, 64, 32
    for proj, rows, cols in (("gate_up_proj", 2 * I, D), ("down_proj", D, I)):
        blocks = torch.randint(0, 256, (E, rows, cols // 32, 16), generator=g, dtype=torch.uint8)
        scales = torch.randint(120, 132, (E, rows, cols // 32), generator=g, dtype=torch.uint8)
        name = f"model.layers.0.mlp.experts.{proj}"
        save[name + "_blocks"], save[name + "_scales"] = blocks, scales
        for dt, tag in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            r = tmx.convert_moe_packed_tensors(blocks.clone(), scales.clone(), dtype=dt)
            ref[f"mxfp4_{proj}_{tag}"] = r.float().numpy()
    save_file(save, str(out / "tensors.safetensors"))
    (out / "tensors.safetensors").chmod(0o644)
    np.savez_compressed(out / "tensors_reference.npz", **ref)


def llama_fp8(out: pathlib.Path):
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers.integrations import finegrained_fp8 as tf8

    out.mkdir(parents=True, exist_ok=True)
    cfg = transformers.LlamaConfig(**LLAMA)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    deq = tf8.Fp8Dequantize(None)
    save = {}
    state = model.state_dict()
    with torch.no_grad():
        for name, p in state.items():
            proj = name.endswith("_proj.weight")
            if not proj:   # embeddings, norms, lm_head stay unquantized, in bf16
                save[name] = p.to(torch.bfloat16).contiguous()
                p.copy_(save[name].float())
                continue
            layer = int(name.split(".")[2])
            q, s = quantize_fp8(p.float(), LLAMA_BLOCK, e8m0=layer == 1)
            save[name], save[name.replace("weight", "weight_scale_inv")] = q, s
            p.copy_(deq._dequantize_one(q, s, output_dtype=torch.float32))
        ids = torch.randint(0, LLAMA["vocab_size"], (2, 24), generator=torch.Generator()
                            .manual_seed(1))
        logits = model(ids).logits.float().numpy()
    save_file(save, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)
    config = json.loads(cfg.to_json_string())
    config.update(dtype="bfloat16", quantization_config=dict(
        quant_method="fp8", fmt="e4m3", activation_scheme="dynamic",
        weight_block_size=list(LLAMA_BLOCK)))
    (out / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    np.savez_compressed(out / "reference.npz", input_ids=ids.numpy().astype(np.int32),
                        logits=logits, transformers=transformers.__version__,
                        torch=torch.__version__)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "tests/data/hf_quant"))
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tensors(out)
    llama_fp8(out / "llama_fp8")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"quantized fixtures: {size / 1e3:.0f} kB in {out}")


if __name__ == "__main__":
    main()
