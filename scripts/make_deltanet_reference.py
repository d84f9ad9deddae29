"""Build tests/data/deltanet_layer.npz: transformers' Gated DeltaNet layers on one input.

    pip install -e '.[hf]'          # torch (CPU) + transformers: this script only
    python scripts/make_deltanet_reference.py [--out=tests/data/deltanet_layer.npz]

Two tiny random layers (Qwen3-Next's fused ``in_proj_qkvz``/``in_proj_ba`` and Qwen3.5's
separate ``in_proj_qkv``/``z``/``b``/``a``), 2 key heads serving 4 value heads, kernel 4,
with their parameters under transformers' names (``next.*``, ``q35.*``), the input ``x``
(2, 21, 32) and each layer's float32 output (``next.y``, ``q35.y``). Weights are drawn
at scales where every piece matters: beta spread over (0, 1), decays from near 1 to
near 0, a gated norm weight away from 1. tests/unit/models/test_deltanet.py compares
``dynjax.models.components.deltanet`` against it without torch.
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
SIZES = dict(hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4,
             linear_key_head_dim=8, linear_value_head_dim=6, linear_conv_kernel_dim=4,
             rms_norm_eps=1e-6, hidden_act="silu")
SHAPE = (2, 21)


def layers():
    """(prefix, module) of both layouts, weights drawn by a seeded generator."""
    import torch
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet
    from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    torch.manual_seed(0)
    out = []
    for prefix, config_cls, layer_cls in (("next", Qwen3NextConfig, Qwen3NextGatedDeltaNet),
                                          ("q35", Qwen3_5TextConfig, Qwen3_5GatedDeltaNet)):
        cfg = config_cls(num_hidden_layers=1, layer_types=["linear_attention"], **SIZES)
        layer = layer_cls(cfg, 0).eval()
        with torch.no_grad():
            for name, w in layer.named_parameters():
                if name == "A_log":
                    w.copy_(torch.log(torch.empty_like(w).uniform_(0.05, 4.0)))
                elif name == "dt_bias":
                    w.copy_(torch.randn_like(w))
                elif name == "norm.weight":
                    w.copy_(1.0 + 0.3 * torch.randn_like(w))
                elif name == "conv1d.weight":
                    w.copy_(0.5 * torch.randn_like(w))
                else:
                    w.copy_(torch.randn_like(w) / np.sqrt(w.shape[-1]))
        out.append((prefix, layer))
    return out


def main():
    import torch
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="tests/data/deltanet_layer.npz")
    args = parser.parse_args()
    arrays = {}
    x = torch.randn(*SHAPE, SIZES["hidden_size"], generator=torch.Generator().manual_seed(1))
    arrays["x"] = x.numpy()
    for prefix, layer in layers():
        with torch.no_grad():
            arrays[f"{prefix}.y"] = layer(x).numpy()
        for name, w in layer.state_dict().items():
            arrays[f"{prefix}.{name}"] = w.numpy()
    out = ROOT / args.out
    np.savez_compressed(out, **arrays)
    print(f"wrote {args.out}: {len(arrays)} arrays, {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
