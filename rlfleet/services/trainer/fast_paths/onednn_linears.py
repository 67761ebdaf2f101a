"""The trainer's nn.Linear modules through oneDNN on a CPU (`perf.onednn_linear`, on by default; float32 compute).

Forward and both backward matmuls of each linear run by rlfleet/cpu_kernels/onednn.py (oneDNN unless the product
is
small): on the AMD CPU here MKL, which torch's F.linear calls, runs its AVX2 code, and oneDNN its AVX-512 code.
Measured at the addition example's trainer shapes (1500 rows, one thread): [384 x 128] forward 1.46 -> 0.56 ms,
dx 1.30 -> 0.57 ms, dW 1.37 -> 0.88 ms. Rounding differs from MKL's by ~1e-6 relative (another summation order).

`use_onednn_linears(model)` swaps each module that is exactly nn.Linear for a OneDNNLinear holding the same weight
and bias Parameters (module paths, state-dict names and ties are unchanged, so checkpoints, publishing and FSDP see
no difference). It runs before FSDP shards the model, which registers its hooks on the modules present then. The
true on-policy mode never swaps: its batch-invariant kernels must see every matmul as an aten op.
"""

from __future__ import annotations

import torch
from torch import nn

from rlfleet.cpu_kernels import onednn_linear_autograd, onednn_usable


class OneDNNLinear(nn.Module):
    """x [..., in] -> x W^T + b [..., out], W [out, in], by rlfleet.cpu_kernels.onednn_linear_autograd."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None) -> None:
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.in_features, self.out_features = int(weight.shape[1]), int(weight.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return onednn_linear_autograd(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def use_onednn_linears(model: nn.Module, device: torch.device, dtype: torch.dtype) -> int:
    """Replace every plain nn.Linear of `model` by a OneDNNLinear on the same Parameters, where oneDNN is usable for
    the device and dtype the model will compute on (its weights may still be on the meta device, loaded after
    sharding); returns how many were replaced (0 where it is not usable)."""
    linears = [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear]
    if not linears or not onednn_usable(device, dtype):
        return 0
    for name, module in linears:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, OneDNNLinear(module.weight, module.bias))
    return len(linears)
