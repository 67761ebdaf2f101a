"""Linear layers through oneDNN on a CPU, for code that owns its matmuls (the rollout engine's lean Llama step, the
trainer's linear modules), where torch's `F.linear`/`mm`/`addmm` call MKL.

Why: MKL picks its kernels by CPU vendor, and on an AMD CPU it runs its AVX2 code even where the CPU has AVX-512;
oneDNN (also inside every CPU build of torch) dispatches on the instruction sets the CPU reports. On the AMD EPYC
(Zen 4) here, float32, 64 rows, one thread: SmolLM2-135M's q/k/v [960 x 576] 723 -> 359 us, gate/up [3072 x 576]
2.53 -> 1.13 ms, the LM head [49152 x 576] 48 -> 19.6 ms; the addition model's [384 x 128] 62 -> 40 us (two
threads: 1.5-2.8x). On an Intel CPU MKL has its AVX-512 code too, and the two are about even.

What it costs: not bitwise MKL's result. oneDNN sums the K products in its own blocked order, so an output differs
from F.linear's by rounding (relative ~1e-6 at K = 576), as two BLAS libraries do. The batch-invariant on-policy mode
(rlfleet/cpu_kernels/invariant_ops.py) never comes here: it needs every matmul as an aten op it can replace.

Small products stay with torch's op: a oneDNN call costs ~12 us before any arithmetic (F.linear ~1.5 us), so below
MIN_MACS multiply-adds (rows x N x K) MKL is as fast or faster (here: [64 x 128] x [128 x 128] 23 vs 23 us, a
19-entry LM head 9 vs 16 us, one-row decode always); `linear` and `linear_add` choose by that size.

The op is `torch.ops.mkldnn._linear_pointwise`, the fused linear (+ bias, + a pointwise or binary epilogue) that
torch's inductor emits for CPU linears; it takes dense tensors and a plain [N, K] weight. `usable` probes it once
per dtype (present, runs, agrees with F.linear) so a torch build without oneDNN falls back to F.linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DTYPES = (torch.float32, torch.bfloat16)
MIN_MACS = 1_500_000             # oneDNN from this many multiply-adds a call (see above)
PROBE_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2}      # max |difference| / max |F.linear| on the probe


def _op() -> object | None:
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return getattr(mkldnn, "_linear_pointwise", None) if mkldnn is not None else None


def usable(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether oneDNN linears run here and agree with F.linear (a probe of a few rows, run on each call: cheap)."""
    if device.type != "cpu" or dtype not in DTYPES or not torch.backends.mkldnn.is_available() or _op() is None:
        return False
    g = torch.Generator().manual_seed(0)
    x = torch.randn(MIN_MACS // 960 + 1, 40, generator=g).to(dtype)               # [B, K]: takes oneDNN
    w = torch.randn(24, 40, generator=g).to(dtype)                                # [N, K]
    b = torch.randn(24, generator=g).to(dtype)
    other = torch.randn(x.shape[0], 24, generator=g).to(dtype)
    try:
        with torch.no_grad():
            got, got_add = linear(x, w, b), linear_add(x, other, w, b)
    except (RuntimeError, NotImplementedError):
        return False
    with torch.no_grad():
        ref = F.linear(x.float(), w.float(), b.float())
    scale = float(ref.abs().max())
    tol = PROBE_TOLERANCE[dtype] * scale
    return bool(got.shape == ref.shape and (got.float() - ref).abs().max() <= tol
                and (got_add.float() - (ref + other.float())).abs().max() <= tol)


def _small(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return x.shape[0] * weight.shape[0] * weight.shape[1] < MIN_MACS


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, weight, bias), by oneDNN unless small. x: [B, K] (any strides); weight: [N, K]; bias: [N] or
    None. Returns [B, N]."""
    if _small(x, weight):
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def linear_add(x: torch.Tensor, other: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
               ) -> torch.Tensor:
    """other + F.linear(x, weight, bias), by oneDNN (the add fused into the matmul's epilogue) unless small.
    x: [B, K]; other: [B, N]; weight: [N, K]. Returns [B, N]."""
    if _small(x, weight):
        return torch.addmm(other, x, weight.t()) if bias is None else other + F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise.binary(x, other, weight, bias, "add")


class LinearFunction(torch.autograd.Function):
    """F.linear with autograd, each of its three matmuls through `linear` (by oneDNN unless small): forward
    y = x W^T + b, backward dx = dy W and dW = dy^T x (transposed views: oneDNN reads them as they are).
    x: [M, K]; weight: [N, K]; bias: [N] or None."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return linear(x, weight, bias)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, *grads: torch.Tensor
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        (dy,) = grads                                                             # [M, N]
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        dx = linear(dy, weight.t(), None) if need_x else None                     # [M, K]
        dw = linear(dy.t(), x.t(), None) if need_w else None                      # [N, K]
        db = dy.sum(0) if need_b and ctx.has_bias else None
        return dx, dw, db


def linear_autograd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [..., K], differentiable, its matmuls by `linear`. Returns [..., N]."""
    lead = x.shape[:-1]
    y = LinearFunction.apply(x.reshape(-1, x.shape[-1]), weight, bias)
    return y.view(*lead, weight.shape[0])
