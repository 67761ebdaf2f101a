"""The full HF-named state dict on global rank 0, gathered from every tensor- and pipeline-parallel shard."""

from __future__ import annotations

import torch
import torch.distributed as dist

from rlfleet.services.trainer.backends.megatron.convert import (
    EMBED,
    LM_HEAD,
    Layout,
    hf_layout,
    hf_stage,
    tp_dim,
    unshard,
)
from rlfleet.services.trainer.backends.megatron.model import ModelShape


def _tp_gather(tensor: torch.Tensor, dim: int | None, layout: Layout) -> list[torch.Tensor]:
    """Every tensor-parallel rank's copy of `tensor` (in rank order); a replicated tensor is returned once."""
    from megatron.core import parallel_state

    if dim is None or layout.tp == 1:
        return [tensor]
    parts = [torch.empty_like(tensor) for _ in range(layout.tp)]
    dist.all_gather(parts, tensor.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
    return parts


def stage_state_dict(model: torch.nn.Module, shape: ModelShape, layout: Layout) -> dict[str, torch.Tensor]:
    """Collective over the tensor-parallel group: this stage's tensors under their HF names (full, on CPU)."""
    out: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        shards = _tp_gather(param.detach(), tp_dim(name), layout)
        out.update({k: v.cpu() for k, v in unshard(shape, name, shards, layout.pp_rank, layout.pp).items()})
    if shape.tied and layout.pp == 1:
        out[LM_HEAD] = out[EMBED]
    return out


def full_state_dict(model: torch.nn.Module, shape: ModelShape, layout: Layout, dp_rank: int,
                    dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Collective on every rank. Global rank 0 gets every HF tensor (CPU, `dtype`, HF order); others get {}."""
    from megatron.core import parallel_state

    local = stage_state_dict(model, shape, layout)
    if layout.tp_rank != 0 or dp_rank != 0:
        return {}
    group = parallel_state.get_pipeline_model_parallel_group()
    ranks = dist.get_process_group_ranks(group) if layout.pp > 1 else [dist.get_rank()]
    device = next(model.parameters()).device
    out: dict[str, torch.Tensor] = {}
    for name, size in hf_layout(shape):
        stage = hf_stage(shape, name, layout.pp)
        if layout.pp > 1:
            if stage == layout.pp_rank:
                buf = local[name].to(device)
            else:
                buf = torch.empty(size, dtype=next(model.parameters()).dtype, device=device)
            dist.broadcast(buf, src=ranks[stage], group=group)
            tensor = buf.cpu()
        else:
            tensor = local[name]
        if layout.pp_rank == 0:
            out[name] = tensor.to(dtype) if tensor.is_floating_point() else tensor
    return out if dist.get_rank() == 0 else {}
