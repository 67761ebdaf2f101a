"""The pieces of the lean Llama-family math that the decode step (fast_decode.py) and the packed prefill
(fast_prefill.py) share: a linear with its residual folded in, and rotary cos/sin by position (RMSNorm:
rlfleet/rms_norm.py, shared with the trainer)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

POSITION_DEPENDENT_ROPE = ("dynamic", "longrope")     # inv_freq changes with the sequence length: no table


def residual_linear(x: torch.Tensor, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                     ) -> torch.Tensor:
    """x + a @ weight.T (+ bias). x: [B, N]; a: [B, K]; weight: [N, K]."""
    if bias is None:
        return torch.addmm(x, a, weight.t())
    return x + F.linear(a, weight, bias)


class Rotary:
    """cos/sin [B, H+Hkv, Dh] for a step's positions: q's heads carry the attention scale, sin carries
    rotate_half's sign so that rotate_half(x)·sin == roll(x, Dh/2)·sin'. Looked up in a table grown on demand
    (equal to the rotary module's own values: position·inv_freq is one product); rope types whose frequencies
    depend on the sequence length ask the module every step."""

    def __init__(self, rotary: nn.Module, heads: int, kv_heads: int, head_dim: int, scale: float,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.rotary = rotary
        self.per_step = getattr(rotary, "rope_type", "default") in POSITION_DEPENDENT_ROPE
        half = head_dim // 2
        head_scale = torch.tensor([scale] * heads + [1.0] * kv_heads, device=device).unsqueeze(1)   # [H+Hkv, 1]
        sign = torch.tensor([-1.0] * half + [1.0] * (head_dim - half), device=device)               # [Dh]
        self.cos_factor = head_scale.expand(-1, head_dim).to(dtype)                                  # [H+Hkv, Dh]
        self.sin_factor = (head_scale * sign).to(dtype)                                              # [H+Hkv, Dh]
        self._cos = torch.zeros(0, head_dim, dtype=dtype, device=device)                            # [P, Dh]
        self._sin = self._cos

    def _table(self, upto: int) -> None:
        size = max(upto, 2 * self._cos.shape[0], 256)
        probe = torch.zeros(1, dtype=self._cos.dtype, device=self._cos.device)
        cos, sin = self.rotary(probe, torch.arange(size, device=self._cos.device).unsqueeze(0))    # [1, P, Dh]
        self._cos, self._sin = cos[0], sin[0]

    def __call__(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """pos: [B] positions of the new tokens. Returns (cos, sin), each [B, H+Hkv, Dh]."""
        if self.per_step:
            probe = torch.zeros(1, dtype=self._cos.dtype, device=self._cos.device)
            cos, sin = (t[:, 0] for t in self.rotary(probe, pos.unsqueeze(1)))                      # [B, Dh]
        else:
            top = int(pos.max()) + 1 if pos.numel() else 0
            if top > self._cos.shape[0]:
                self._table(top)
            cos, sin = self._cos[pos], self._sin[pos]                                               # [B, Dh]
        return cos.unsqueeze(1) * self.cos_factor, sin.unsqueeze(1) * self.sin_factor
