"""The pieces of the lean Llama-family math that the decode step (fast_decode.py) and the packed prefill
(fast_prefill.py) share: a linear with its residual folded in, the MLP block, the LM head, and rotary cos/sin by
position (RMSNorm: rlfleet/cpu_kernels/rms_norm.py, shared with the trainer).

Who runs the matmuls is a `Linears`: on a CPU with a usable oneDNN, OneDNNLinears
(rlfleet/cpu_kernels/onednn.py; about
twice MKL's speed on the AMD CPU here, rounding ~1e-6 apart: `perf.onednn_linear` turns it off), else BlasLinears,
torch's own ops, which on a CPU call MKL and run feature-major where that is faster:

Feature-major matmuls (BlasLinears). `F.linear(x, W)` for activations x [B, K] asks BLAS for x @ W.T; asking it for the
transpose, W @ x.T ([N, B]), runs the same dot products in the same order (bitwise equal results on the CPU here)
but, for the few-row batches of a decode step, in a faster kernel: with SmolLM2-135M's shapes at 64 rows and 2
threads, gate/up [3072 x 576] 1.84 -> 1.48 ms, the whole MLP block 3.6 -> 2.6 ms, the LM head [49152 x 576] ~40 ->
~30 ms (in chunks of LOGIT_CHUNK vocabulary rows, each transposed back to [B, V] while it is still in cache;
unchunked the later [B, V] reads of the sampler would pay for the strided layout). The MLP keeps its hidden
activations feature-major ([F, B]: gate and up are row blocks, contiguous), and the down projection reads them
through a transposed view, which BLAS takes as a flag."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from rlfleet.cpu_kernels import fused_rms_norm as norm
from rlfleet.cpu_kernels import onednn_linear, onednn_linear_add, onednn_usable
from rlfleet.services.rollout.engines.lean_llama.fused_params import LayerParams

LOGIT_CHUNK = 1024                                    # vocabulary rows per LM-head matmul on a CPU (see above)
POSITION_DEPENDENT_ROPE = ("dynamic", "longrope")     # inv_freq changes with the sequence length: no table


def residual_linear(x: torch.Tensor, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                     ) -> torch.Tensor:
    """x + a @ weight.T (+ bias). x: [B, N]; a: [B, K]; weight: [N, K]."""
    if bias is None:
        return torch.addmm(x, a, weight.t())
    return x + F.linear(a, weight, bias)


def feature_major_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, weight, bias) transposed: [N, B] contiguous. x: [B, K]; weight: [N, K]; bias: [N] or None."""
    if bias is None:
        return torch.mm(weight, x.t())
    return torch.addmm(bias.unsqueeze(1), weight, x.t())


class Linears(Protocol):
    """The matmuls of the lean step: which library runs them (BlasLinears, OneDNNLinears)."""

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """F.linear: x [B, K], weight [N, K] -> [B, N]."""
        ...

    def residual(self, x: torch.Tensor, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                 ) -> torch.Tensor:
        """x + a @ weight.T (+ bias). x: [B, N]; a: [B, K]."""
        ...

    def mlp_residual(self, x: torch.Tensor, p: LayerParams, eps: float) -> torch.Tensor:
        """x + down(silu(gate(n)) · up(n)) with n = RMSNorm(x), the layer's second half. x: [B, D] -> [B, D]."""
        ...

    def lm_head(self, x: torch.Tensor, head: nn.Module) -> torch.Tensor:
        """head(x): logits [B, V] contiguous, for x [B, D]."""
        ...


class BlasLinears:
    """torch's own ops (MKL on a CPU), feature-major where that is faster (see the module docstring)."""

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, weight, bias)

    def residual(self, x: torch.Tensor, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                 ) -> torch.Tensor:
        return residual_linear(x, a, weight, bias)

    def mlp_residual(self, x: torch.Tensor, p: LayerParams, eps: float) -> torch.Tensor:
        gu = feature_major_linear(norm(x, p.ln2, eps), p.gate_up, p.gate_up_bias)       # [2F, B]
        width = gu.shape[0] // 2
        hidden = F.silu(gu[:width]).mul_(gu[width:])                                      # [F, B]
        return residual_linear(x, hidden.t(), p.down, p.down_bias)

    def lm_head(self, x: torch.Tensor, head: nn.Module) -> torch.Tensor:
        """On a CPU by LOGIT_CHUNK-row feature-major blocks when the head is a plain nn.Linear (any other module is
        called as it is)."""
        if type(head) is not nn.Linear or x.device.type != "cpu" or head.weight.shape[0] <= LOGIT_CHUNK:
            return head(x)
        weight, bias = head.weight, head.bias
        out = x.new_empty(x.shape[0], weight.shape[0])                                    # [B, V]
        for start in range(0, weight.shape[0], LOGIT_CHUNK):
            stop = start + LOGIT_CHUNK
            block = feature_major_linear(x, weight[start:stop], None if bias is None else bias[start:stop])
            out[:, start:stop] = block.t()                                                # [B, chunk]
        return out


class OneDNNLinears:
    """oneDNN's fused linears on a CPU (rlfleet/cpu_kernels/onednn.py: ~2x MKL's speed on an AMD CPU), residual
    adds
    fused into the output matmuls' epilogue; activations stay row-major (oneDNN has no strided-layout gap)."""

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return onednn_linear(x, weight, bias)

    def residual(self, x: torch.Tensor, a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                 ) -> torch.Tensor:
        return onednn_linear_add(a, x, weight, bias)

    def mlp_residual(self, x: torch.Tensor, p: LayerParams, eps: float) -> torch.Tensor:
        gu = onednn_linear(norm(x, p.ln2, eps), p.gate_up, p.gate_up_bias)       # [B, 2F]
        width = gu.shape[1] // 2
        hidden = F.silu(gu[:, :width]).mul_(gu[:, width:])                                # [B, F]
        return onednn_linear_add(hidden, x, p.down, p.down_bias)

    def lm_head(self, x: torch.Tensor, head: nn.Module) -> torch.Tensor:
        if type(head) is not nn.Linear:
            return head(x)
        return onednn_linear(x, head.weight, head.bias)


def pick_linears(weight: torch.Tensor, onednn: bool = True) -> Linears:
    """OneDNNLinears where asked for and usable for weight's device and dtype, else BlasLinears."""
    if onednn and onednn_usable(weight.device, weight.dtype):
        return OneDNNLinears()
    return BlasLinears()


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
