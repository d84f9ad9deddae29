"""Build tests/data/export_reference.npz: transformers' logits of exported dynjax models.

    pip install -e '.[hf]'          # torch (CPU) + transformers: this script only
    python scripts/make_export_reference.py [--out=tests/data/export_reference.npz]

For each case of tests/integration/test_export.py (``CASES``: a Llama upcycled into MoE, which goes out
as Mixtral, and the routing study's OLMoE-style arm, tiny), the model is exported with
``dynjax.export.export_params``, loaded by ``transformers.AutoModelForCausalLM`` in
float32, and run on the case's tokens. Stored per case: ``tokens``, transformers'
``logits``, and ``max_abs_dlogit`` against dynjax's own forward of the same parameters.
The script checks every top-k margin is far above float32 noise (so the two sides route
alike) and that the difference is <= 1e-4.
"""
from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dynjax.runtime import setup  # noqa: E402  one runtime set-up for every program (dynjax/runtime.py)
setup(__name__)
import argparse  # noqa: E402
import tempfile  # noqa: E402

import numpy as np  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "tests" / "data" / "export_reference.npz"))
    args = parser.parse_args()
    import jax
    import jax.numpy as jnp
    import torch
    from transformers import AutoModelForCausalLM

    from dynjax import export
    from dynjax.models import llm
    from tests.integration.test_export import CASES, TOL, case

    out = {}
    for name in CASES:
        cfg, params, tokens = case(name)
        ours, coeffs = jax.jit(llm.LLM(cfg).apply)(params, jnp.asarray(tokens))
        top = np.sort(np.asarray(coeffs["router"]), -1)[..., ::-1]
        margin = float(np.min(top[..., cfg.top_k - 1] - top[..., cfg.top_k]))
        assert margin > 1e-5, f"{name}: top-k margin {margin} is within float noise"
        with tempfile.TemporaryDirectory() as tmp:
            d = pathlib.Path(tmp) / name
            export.export_params(cfg, params, d, max_positions=64)
            model = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
            with torch.no_grad():
                theirs = model(torch.as_tensor(tokens, dtype=torch.long)).logits.numpy()
        diff = float(np.max(np.abs(np.asarray(ours) - theirs)))
        assert diff <= TOL, f"{name}: max |dlogit| {diff} > {TOL}"
        print(f"{name}: {type(model).__name__}, max |dlogit| {diff:.2e}, "
              f"smallest top-k margin {margin:.3g}")
        out.update({f"{name}.tokens": tokens, f"{name}.logits": theirs.astype(np.float32),
                    f"{name}.max_abs_dlogit": np.float32(diff)})
    np.savez_compressed(args.out, **out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
