"""Filling buckets from a stream of tensors: per-dtype open buckets, each handed out the moment it is full.

The layout (layout.py) fixes where every byte goes. Tensors arrive one at a time in spec order; each dtype has one
open bucket; a tensor's bytes are copied into it (running on into the next bucket of its dtype), hashed on the way,
and every bucket whose data is complete is yielded as (bucket index, uint8 view [bucket size]). The caller gives the
buffer back with `release` once it has sent it, so at most (open buckets + buckets in flight) exist at once: the
sender sends bucket i while the next one is being gathered and copied.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence

import torch
import xxhash

from rlfleet.services.weight_sync.transports.layout import Layout, TensorSpec
from rlfleet.weights.dtypes import DTYPES


def bucket_data_ends(layout: Layout) -> list[int]:
    """Bytes of real data in each bucket (the rest is zero padding)."""
    ends = [0] * layout.num_buckets
    for p in layout.placements:
        bucket, offset, left = p.bucket, p.offset, p.nbytes
        while left:
            take = min(left, layout.bucket_bytes - offset)
            ends[bucket] = max(ends[bucket], offset + take)
            bucket, offset, left = bucket + 1, 0, left - take
    return ends


def emission_order(layout: Layout) -> list[int]:
    """The order in which BucketFiller completes buckets for tensors given in layout order."""
    ends = bucket_data_ends(layout)
    filled = [0] * layout.num_buckets
    order: list[int] = []
    for p in layout.placements:
        bucket, offset, left = p.bucket, p.offset, p.nbytes
        while left:
            take = min(left, layout.bucket_bytes - offset)
            filled[bucket] += take
            if filled[bucket] == ends[bucket]:
                order.append(bucket)
            bucket, offset, left = bucket + 1, 0, left - take
    return order


def _raw(t: torch.Tensor) -> torch.Tensor:
    """t: any shape -> [nbytes] uint8 (same device)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


class BucketFiller:
    """Copies tensors into buckets of `layout` on `device`; `hashes` holds each tensor's xxh64 after `fill`."""

    def __init__(self, layout: Layout, specs: Sequence[TensorSpec], device: torch.device | str = "cpu",
                 pool: list[torch.Tensor] | None = None) -> None:
        """pool: free bucket buffers kept by the caller across versions (released ones go back into it), so a
        sender allocates -- and a NIXL sender registers -- its buffers once per run, not once per version."""
        self.layout = layout
        self.specs = list(specs)
        self.device = torch.device(device)
        self.hashes: list[str] = []
        self._free: list[torch.Tensor] = pool if pool is not None else []
        self._ends = bucket_data_ends(layout)

    def release(self, buf: torch.Tensor) -> None:
        """Give back a bucket buffer the caller has finished sending."""
        self._free.append(buf._base if buf._base is not None else buf)

    def _take(self, bucket: int) -> torch.Tensor:
        """A buffer for `bucket`: its data region [0, end) is about to be overwritten whole, the padding is zeroed."""
        need = self.layout.bucket_bytes
        fits = [i for i, b in enumerate(self._free) if b.numel() >= need and b.device == self.device]
        buf = self._free.pop(fits[-1]) if fits else torch.empty(self.layout.bucket_bytes, dtype=torch.uint8,
                                                                device=self.device)
        view = buf[:self.layout.bucket_sizes[bucket]]
        view[self._ends[bucket]:].zero_()
        return view

    def fill(self, named: Iterable[tuple[str, torch.Tensor]]) -> Generator[tuple[int, torch.Tensor], None, None]:
        layout = self.layout
        open_: dict[int, torch.Tensor] = {}
        filled = [0] * layout.num_buckets
        self.hashes = []
        it = iter(named)
        for spec, p in zip(self.specs, layout.placements, strict=True):
            name, t = next(it)
            if name != spec.name or tuple(t.shape) != spec.shape or DTYPES[spec.dtype] != t.dtype:
                raise ValueError(f"tensor {name} {t.dtype}{list(t.shape)} does not match the planned "
                                 f"{spec.name} {spec.dtype}{list(spec.shape)}")
            raw = _raw(t)                                          # [nbytes] uint8
            h = xxhash.xxh64()
            host = raw if raw.device.type == "cpu" else None
            if host is None and p.nbytes:
                host = raw.cpu()                                   # hashing reads host bytes
            if p.nbytes and host is not None:
                h.update(memoryview(host.numpy()))
            self.hashes.append(h.hexdigest())
            bucket, offset, pos = p.bucket, p.offset, 0
            while pos < p.nbytes:
                take = min(p.nbytes - pos, layout.bucket_bytes - offset)
                if bucket not in open_:
                    open_[bucket] = self._take(bucket)
                open_[bucket][offset:offset + take].copy_(raw[pos:pos + take])
                filled[bucket] += take
                if filled[bucket] == self._ends[bucket]:
                    yield bucket, open_.pop(bucket)
                bucket, offset, pos = bucket + 1, 0, pos + take
        if open_:
            raise RuntimeError(f"buckets {sorted(open_)} were never completed")
