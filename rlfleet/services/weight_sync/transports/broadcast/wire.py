"""What travels in the broadcast group before the buckets: a header and a bucket table (int64 tensors)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAGIC = 0x524C464C          # "RLFL"
CLOSE = -1                  # version in a header that ends the group (trainer shutting down)
REFORM = -2                 # version in a header that ends this generation: members join the next (group.py)
HEADER_LEN = 4              # [MAGIC, version, num_buckets, total_bytes]


@dataclass(frozen=True)
class Header:
    version: int
    sizes: tuple[int, ...]      # bytes of each bucket, padding included
    order: tuple[int, ...]      # bucket indices in the order they are broadcast

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)

    def starts(self) -> list[int]:
        out, pos = [], 0
        for s in self.sizes:
            out.append(pos)
            pos += s
        return out


def header_tensor(version: int, num_buckets: int, total_bytes: int) -> torch.Tensor:
    return torch.tensor([MAGIC, version, num_buckets, total_bytes], dtype=torch.int64)   # [4]


def table_tensor(sizes: list[int] | tuple[int, ...], order: list[int] | tuple[int, ...]) -> torch.Tensor:
    return torch.tensor([*sizes, *order], dtype=torch.int64)                                # [2 * num_buckets]


def parse(header: torch.Tensor, table: torch.Tensor) -> Header:
    magic, version, nb, total = (int(x) for x in header.tolist())
    if magic != MAGIC:
        raise ValueError(f"broadcast header has magic {magic:#x}, expected {MAGIC:#x}")
    values = [int(x) for x in table.tolist()]
    h = Header(version, tuple(values[:nb]), tuple(values[nb:]))
    if h.total_bytes != total or sorted(h.order) != list(range(nb)):
        raise ValueError("broadcast bucket table is inconsistent with its header")
    return h
