"""Model FLOPs utilisation: analytic model FLOPs per train step / step time / the peak.

Model FLOPs are 3x ``execution.analytic_forward_flops`` (forward, then backward at twice
the forward): matmuls only, attention over the full T x T square, no rematerialisation.
The peaks below are the one table of them in dynjax.
"""
from __future__ import annotations

from typing import Optional

from dynjax.measure.lm_execution import analytic_forward_flops
from dynjax.models.transformer import ModelConfig

# Dense (no sparsity) peak FLOP/s of one chip by ``jax.devices()[0].device_kind`` prefix
# and compute dtype; float32 on NVIDIA is TF32 tensor cores (JAX's default matmul precision).
PEAK_FLOPS = {
    "NVIDIA H200": {"bfloat16": 989e12, "float32": 494e12},
    "NVIDIA H100": {"bfloat16": 989e12, "float32": 494e12},   # SXM
    "NVIDIA A100": {"bfloat16": 312e12, "float32": 156e12},
    "TPU v5p": {"bfloat16": 459e12},
    "TPU v5 lite": {"bfloat16": 197e12},
    "TPU v4": {"bfloat16": 275e12},
}


def peak_flops(device_kind: str, dtype: str) -> Optional[float]:
    """The table's peak for this device and dtype, or None (e.g. a CPU)."""
    for prefix, peaks in PEAK_FLOPS.items():
        if device_kind.startswith(prefix):
            return peaks.get(dtype)
    return None


def train_step_flops(cfg: ModelConfig, batch: int, seq_len: int) -> float:
    return 3.0 * analytic_forward_flops(cfg, batch, seq_len)["total"]


def mfu(cfg: ModelConfig, batch: int, seq_len: int, step_s: float,
        device_kind: str) -> Optional[float]:
    """Fraction of the device's peak that the model FLOPs of one step at ``step_s`` use."""
    peak = peak_flops(device_kind, cfg.dtype)
    return None if peak is None else train_step_flops(cfg, batch, seq_len) / step_s / peak
