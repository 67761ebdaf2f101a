"""Row operations on a left-padded batched KV cache (transformers DynamicCache), for continuous batching.

Every layer holds keys and values of shape [B, H, L, D]; `mask` [B, L] marks which of the L columns are real tokens
(1) and which are left padding (0). Rows join (merge), leave (select) and all-padding columns are dropped (trim).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class UnsupportedCacheError(TypeError):
    """The model's cache has layers other than plain full-attention DynamicLayers."""


def _layers(cache: DynamicCache) -> list[DynamicLayer]:
    layers = list(cache.layers)
    for layer in layers:
        if type(layer) is not DynamicLayer:
            raise UnsupportedCacheError(f"continuous batching supports full-attention layers only, "
                                        f"not {type(layer).__name__}")
    return layers


def _pad_left(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    extra = length - t.shape[dim]
    if extra == 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def merge(a: DynamicCache, mask_a: torch.Tensor, b: DynamicCache, mask_b: torch.Tensor
          ) -> tuple[DynamicCache, torch.Tensor]:
    """Rows of a, then rows of b, left-padded to a common length. Returns (a updated in place, mask [Ba+Bb, L])."""
    length = max(mask_a.shape[1], mask_b.shape[1])
    for la, lb in zip(_layers(a), _layers(b), strict=True):
        la.keys = torch.cat([_pad_left(la.keys, length, 2), _pad_left(lb.keys, length, 2)], dim=0)
        la.values = torch.cat([_pad_left(la.values, length, 2), _pad_left(lb.values, length, 2)], dim=0)
    mask = torch.cat([_pad_left(mask_a, length, 1), _pad_left(mask_b, length, 1)], dim=0)
    return a, mask


def first_real_column(mask: torch.Tensor) -> int:
    """The first column of mask [R, L] that holds a real token in some row (L if none does)."""
    real = mask.any(dim=0).nonzero()
    return int(real[0]) if real.numel() else mask.shape[1]


def select(cache: DynamicCache, mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Keep only `rows` ([R] int64) of the cache (in place) and drop the columns that became all padding.

    Returns the new mask [R, L'].
    """
    mask = mask[rows]
    start = first_real_column(mask)
    for layer in _layers(cache):
        layer.keys = layer.keys[rows, :, start:]
        layer.values = layer.values[rows, :, start:]
    return mask[:, start:]
