"""The few collectives the trainer needs, on the default process group: bytes broadcast, float sums, int max."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def broadcast_bytes(data: bytes | None, device: torch.device, src: int = 0) -> bytes:
    """Send `data` from rank `src` to every rank as a uint8 tensor (length first). Other ranks pass None."""
    if dist.get_world_size() == 1:                   # nobody to send to: no copy, no collective
        return bytes(data or b"")
    is_src = dist.get_rank() == src
    size = torch.tensor([len(data) if is_src and data is not None else 0], dtype=torch.int64, device=device)
    dist.broadcast(size, src=src)
    n = int(size.item())
    if is_src:
        assert data is not None
        buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if n else \
            torch.empty(0, dtype=torch.uint8, device=device)
    else:
        buf = torch.empty(n, dtype=torch.uint8, device=device)
    if n:
        dist.broadcast(buf, src=src)
    return bytes(buf.cpu().numpy().tobytes()) if not is_src else bytes(data or b"")


def all_reduce_sum(values: Sequence[float], device: torch.device) -> list[float]:
    """Elementwise sum of `values` over ranks (float64 on the wire)."""
    if not values:
        return []
    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    if dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.cpu().tolist()


def all_reduce_max_floats(values: Sequence[float], device: torch.device) -> list[float]:
    """Elementwise max of `values` over ranks (float64 on the wire)."""
    if not values:
        return []
    t = torch.tensor(list(values), dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.cpu().tolist()


def all_reduce_max(value: int, device: torch.device) -> int:
    """The largest of every rank's `value` (int64 on the wire); also a barrier. World size 1: `value`."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())
