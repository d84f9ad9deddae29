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
binds on some entries (the script checks). tests/test_deepseek_v4.py compares
``dynjax.models.components`` against it without torch.
"""
from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dynjax._alloc import reexec  # noqa: E402  one runtime set-up for every program (dynjax/_alloc.py)
reexec(__name__)
import argparse  # noqa: E402

import numpy as np  # noqa: E402

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
    return {k: np.asarray(v.detach().numpy()) for k, v in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/data/deepseek_v4_parts.npz")
    args = ap.parse_args()
    arrays = build()
    path = pathlib.Path(args.out)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, **arrays)
    tmp.replace(path)
    print(f"wrote {path} ({path.stat().st_size} bytes; router margin "
          f"{float(arrays['router.margin']):.3g})")


if __name__ == "__main__":
    main()
