"""Delta encodings of one tensor against its previous published value (raw bytes, so every dtype works).

- xor: `prev ^ new` over the raw bytes, same size; zeros where nothing changed (zstd shrinks them to almost
  nothing). Self-inverse: applying it twice restores prev.
- overwrite: int64 indices of the elements that changed plus their new raw values. Idempotent: applying it twice
  gives new again.
"""

from __future__ import annotations

import torch

ENCODINGS = ("xor", "overwrite")
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _as_ints(t: torch.Tensor) -> torch.Tensor:
    """Raw bits as an integer tensor of the same element size. t: any shape -> [numel]."""
    return t.detach().contiguous().reshape(-1).view(_INT_OF_SIZE[t.element_size()])


def encode(prev: torch.Tensor, new: torch.Tensor, encoding: str) -> dict[str, torch.Tensor]:
    """Tensors that, with prev, rebuild new exactly. Keys: {"xor"} or {"idx", "val"}."""
    if prev.shape != new.shape or prev.dtype != new.dtype:
        raise ValueError(f"delta needs equal shape and dtype: {prev.dtype}{list(prev.shape)} vs "
                         f"{new.dtype}{list(new.shape)}")
    a, b = _as_ints(prev), _as_ints(new)                   # [numel]
    if encoding == "xor":
        return {"xor": torch.bitwise_xor(a, b)}
    if encoding == "overwrite":
        idx = torch.nonzero(a != b).reshape(-1)            # [changed] int64
        return {"idx": idx, "val": b[idx]}
    raise ValueError(f"unknown delta encoding '{encoding}' (known: {', '.join(ENCODINGS)})")


def apply(prev: torch.Tensor, parts: dict[str, torch.Tensor], encoding: str) -> torch.Tensor:
    """A new tensor: prev with the delta applied (prev is not modified)."""
    out = prev.detach().clone().contiguous()
    ints = out.reshape(-1).view(_INT_OF_SIZE[out.element_size()])
    if encoding == "xor":
        x = parts["xor"]
        if x.numel() != ints.numel():
            raise ValueError(f"xor delta has {x.numel()} elements for a tensor of {ints.numel()}")
        ints.bitwise_xor_(x.view(ints.dtype))
    elif encoding == "overwrite":
        idx, val = parts["idx"], parts["val"]
        if idx.numel() and (int(idx.max()) >= ints.numel() or int(idx.min()) < 0):
            raise ValueError("overwrite delta index out of range")
        ints[idx] = val.view(ints.dtype)
    else:
        raise ValueError(f"unknown delta encoding '{encoding}'")
    return out


def changed_elements(parts: dict[str, torch.Tensor], encoding: str) -> int:
    if encoding == "xor":
        return int(torch.count_nonzero(parts["xor"]))
    return int(parts["idx"].numel())
