"""Batch-invariant CPU kernels for the true on-policy mode (trainer.on_policy): inside `batch_invariant()`, the ops a
causal LM's forward reduces with are replaced by implementations whose result for one row does not depend on the
other rows, on the row's position in the batch, on padding, or on how long the sequence is, so the rollout engine's
KV-cached, batched, left-padded decode and the trainer's right-padded full-sequence forward give bitwise-equal logits.

How (a `TorchDispatchMode`, scoped to the block; nothing global is patched):
- matmul (mm, addmm, bmm, linear, matmul): every output element is the sum of its K products taken in index order
  with one accumulator, as exact IEEE multiplies and adds over whole [M, N] slices; exact zeros -- masked attention
  probabilities, left padding -- leave such a sum bitwise unchanged, so a longer padded row gives the same value.
- softmax, log_softmax and mean over a dimension: sequential sums too (`cumsum` on CPU is a sequential scan with a
  double accumulator), max-shifted as usual.
- transcendental elementwise ops (exp, log, rsqrt, sin, cos, silu, sigmoid, tanh): ATen computes the last
  (numel mod vector width) elements of a tensor with the scalar libm function and the rest with the vectorised
  one, which can differ in the last bit; here every element takes the vectorised path (the input is padded to a
  multiple of 64 elements), so an element's value does not depend on the tensor's size.
- intra-op threads pinned to 1 while the mode is active, and torch's deterministic algorithms on.
Exact IEEE elementwise ops (add, mul, div, neg, max, ...) are invariant already and pass through. The attention must
be the model's eager implementation (its matmuls and softmax are caught here); load models with
`attn_implementation="eager"` (see `load_kwargs`).

CPU and float32 only; far slower than the library kernels (the cost is measured by bench/on_policy_cost.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

LANES = 64                      # pad elementwise inputs to a multiple of this (> 2x the widest vector)
EAGER = {"attn_implementation": "eager"}


def load_kwargs(on_policy: bool) -> dict[str, Any]:
    """Extra from_pretrained arguments: on-policy mode needs the eager attention (plain matmul + softmax)."""
    return dict(EAGER) if on_policy else {}


def _seq_sum(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """Sum along dim in index order with one (double) accumulator: a sequential scan, then its last element."""
    out = torch.cumsum(x, dim=dim).narrow(dim, x.shape[dim] - 1, 1) if x.shape[dim] else \
        torch.zeros_like(x.narrow(dim, 0, 0)).sum(dim, keepdim=True)
    return out if keepdim else out.squeeze(dim)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [..., M, K] @ b [..., K, N] (batch dims broadcast) with each output the sum of its K products in index
    order: acc += a[..., :, k] * b[..., k, :] for k = 0..K-1, exact IEEE multiplies and adds on whole [M, N] slices,
    so the value of an output element depends on its own row and column only."""
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-1]
    cols = a.transpose(-1, -2).expand(*lead, k, m).contiguous().unsqueeze(-1).unbind(-3)   # K x [..., M, 1]
    rows = b.expand(*lead, k, n).contiguous().unsqueeze(-2).unbind(-3)                     # K x [..., 1, N]
    acc = torch.zeros(*lead, m, n, dtype=torch.result_type(a, b))
    prod = torch.empty_like(acc)
    for col, row in zip(cols, rows, strict=True):
        torch.mul(col, row, out=prod)
        acc.add_(prod)
    return acc


def general_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul's shape rules (1-D operands promoted and squeezed back) on top of `matmul`."""
    if a.dim() == 1 and b.dim() == 1:
        return matmul(a[None, :], b[:, None])[0, 0]
    if a.dim() == 1:
        return matmul(a[None, :], b).squeeze(-2)
    if b.dim() == 1:
        return matmul(a, b[:, None]).squeeze(-1)
    if b.dim() == 2 and a.dim() > 2:                   # [..., M, K] @ [K, N]: one [M', K] @ [K, N]
        return matmul(a.reshape(-1, a.shape[-1]), b).reshape(*a.shape[:-1], b.shape[-1])
    return matmul(a, b)


def _softmax(x: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    shifted = x - x.amax(dim=dim, keepdim=True)
    total = _seq_sum(_vector_path(torch.exp, shifted), dim=dim, keepdim=True)
    if log:
        return shifted - _vector_path(torch.log, total)
    return _vector_path(torch.exp, shifted) / total


def _vector_path(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn elementwise with every element on ATen's vectorised path (the input padded to a multiple of LANES)."""
    flat = x.contiguous().reshape(-1)
    pad = (-flat.numel()) % LANES
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    return fn(flat)[:x.numel()].reshape(x.shape)


def _mean(x: torch.Tensor, dims: list[int] | None, keepdim: bool = False, dtype: torch.dtype | None = None
          ) -> torch.Tensor:
    if dtype is not None:
        x = x.to(dtype)
    dims = list(range(x.dim())) if not dims else sorted(d % x.dim() for d in dims)
    count = 1
    out = x
    for d in reversed(dims):
        count *= x.shape[d]
        out = _seq_sum(out, d, keepdim=True)
    if not keepdim:
        for d in reversed(dims):
            out = out.squeeze(d)
    return out / count


UNARY = {aten.exp.default: torch.exp, aten.log.default: torch.log, aten.rsqrt.default: torch.rsqrt,
         aten.sin.default: torch.sin, aten.cos.default: torch.cos, aten.silu.default: torch.nn.functional.silu,
         aten.sigmoid.default: torch.sigmoid, aten.tanh.default: torch.tanh}


class BatchInvariantMode(TorchDispatchMode):
    """Routes the reducing and transcendental ATen ops of plain CPU float32 tensors to the invariant versions."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if not all(t is torch.Tensor for t in types) or not _plain_float32(args):
            return func(*args, **kwargs)
        if func is aten.mm.default or func is aten.bmm.default:
            return matmul(args[0], args[1])
        if func is aten.addmm.default:
            beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
            prod = matmul(args[1], args[2])
            prod = prod if alpha == 1 else prod * alpha
            return prod + (args[0] if beta == 1 else args[0] * beta)
        if func is aten.matmul.default:                    # composite ops arrive undecomposed in inference mode
            return general_matmul(args[0], args[1])
        if func is aten.linear.default:
            out = general_matmul(args[0], args[1].t())
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            return out if bias is None else out + bias
        if func in (aten._softmax.default, aten.softmax.int):
            return _softmax(_cast(args[0], func, args, kwargs), args[1], log=False)
        if func in (aten._log_softmax.default, aten.log_softmax.int):
            return _softmax(_cast(args[0], func, args, kwargs), args[1], log=True)
        if func is aten.mean.dim:
            return _mean(args[0], args[1], *args[2:], **kwargs)
        if func in UNARY:
            return _vector_path(UNARY[func], args[0])
        return func(*args, **kwargs)


def _cast(x: torch.Tensor, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    """softmax.int / log_softmax.int take an optional dtype (the private variants a half_to_float flag)."""
    if func in (aten.softmax.int, aten.log_softmax.int):
        dtype = args[2] if len(args) > 2 else kwargs.get("dtype")
        return x if dtype is None else x.to(dtype)
    return x


def _plain_float32(args: tuple) -> bool:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    return bool(tensors) and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)


def invariant_call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) inside `batch_invariant()` (e.g. the trainer's forward, bound with functools.partial)."""
    with batch_invariant():
        return fn(*args, **kwargs)


@contextmanager
def batch_invariant(enabled: bool = True) -> Iterator[None]:
    """The block's CPU float32 forward computations are batch-invariant (see the module doc); no-op if disabled."""
    if not enabled:
        yield
        return
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        with BatchInvariantMode():
            yield
    finally:
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(threads)
