"""Gradient reduction and clipping for the Megatron backend: sum over data-parallel ranks (each rank's loss is its
share of the global token mean), the tied embedding's two copies summed across the first and last pipeline stage,
and the global L2 norm over all model-parallel shards, counted once each."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

CLIP_EPS = 1e-6           # as torch.nn.utils.clip_grad_norm_


def _all_reduce_coalesced(grads: Sequence[torch.Tensor], group: dist.ProcessGroup) -> None:
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for same in by_dtype.values():
        flat = _flatten_dense_tensors(same)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        for g, reduced in zip(same, _unflatten_dense_tensors(flat, same), strict=True):
            g.copy_(reduced)


def reduce_gradients(model: torch.nn.Module, tied_output: torch.nn.Parameter | None) -> None:
    """Sum gradients over the data-parallel group; with a tied embedding split over pipeline stages, also sum the
    embedding's and the output layer's gradients over the embedding group."""
    from megatron.core import parallel_state

    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if parallel_state.get_data_parallel_world_size() > 1:
        _all_reduce_coalesced([p.grad for p in params], parallel_state.get_data_parallel_group())
    if tied_output is not None and parallel_state.get_pipeline_model_parallel_world_size() > 1:
        dist.all_reduce(tied_output.grad, op=dist.ReduceOp.SUM, group=parallel_state.get_embedding_group())


def clip_gradients(model: torch.nn.Module, max_norm: float, counted: Callable[[str], bool]) -> float:
    """Clip to the global gradient norm (all shards, each element counted once); returns the norm before clipping.
    counted(name): whether this rank's copy of a parameter enters the norm (False for a tensor-parallel duplicate
    on tp rank > 0, and for the last stage's copy of a tied embedding)."""
    from megatron.core import parallel_state

    grads, squares = [], []
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        grads.append(p.grad)
        if counted(name):
            squares.append(p.grad.detach().float().pow(2).sum())
    device = grads[0].device if grads else torch.device("cpu")
    sq = torch.stack(squares).sum() if squares else torch.zeros((), dtype=torch.float32, device=device)
    if dist.get_world_size() > 1:
        dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=parallel_state.get_model_parallel_group())
    norm = float(sq.sqrt())
    if math.isfinite(norm):
        coef = min(max_norm / (norm + CLIP_EPS), 1.0)
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
    return norm
