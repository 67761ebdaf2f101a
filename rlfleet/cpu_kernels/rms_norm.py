"""RMSNorm as the Llama family computes it, shared by the rollout engine's lean decode (engines/lean_llama/) and
the trainer's fused norm modules (services/trainer/fast_paths/fused_norm.py), so both normalise the same way."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim. fp32: one fused op; other dtypes: HF's order (normalise in fp32, cast, scale)."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)
