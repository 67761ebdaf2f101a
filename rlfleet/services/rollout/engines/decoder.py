"""What the torch engine needs of the code that runs its model: a `Decoder`, chosen once when the model loads.

The engine schedules (admission, sampling, finishing rows, weight updates); a Decoder runs the forwards on a
left-padded batched KV cache (transformers DynamicCache, see kv_cache.py): the prefill of admitted prompts, one
decode step of the running batch, and the rows that stay when others finish. Two implement it: the HF modules'
own forward (hf_decoder.py, any causal LM, MoE routes recorded) and the lean Llama-family path
(lean_llama.FastDecoder: same math, fewer ops).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers.cache_utils import DynamicCache


@dataclass(frozen=True)
class Prefilled:
    """A prefill's result for N requests (row n runs prompt rows[n]): P is the longest prompt, V the vocabulary."""

    cache: DynamicCache                 # N rows, P columns (left-padded)
    mask: torch.Tensor                  # [N, P] 1 where a real token sits
    logits: torch.Tensor                # [N, V] next-token logits of each row
    routes: torch.Tensor | None = None  # [N, layers, K] experts each row's last prompt token went to (MoE), else None


@dataclass(frozen=True)
class Decoded:
    """A decode step's result for B running rows."""

    cache: DynamicCache                 # the batch's cache, one column longer
    logits: torch.Tensor                # [B, V] next-token logits of each row
    routes: torch.Tensor | None = None  # [B, layers, K] experts the step's token went to (MoE), else None


class Decoder(Protocol):
    """The forwards of the torch engine's model. `room`: the most tokens any of the rows may still add (>= 1, one a
    step); a decoder that keeps spare cache columns sizes them by it, others ignore it."""

    def prefill(self, prompts: Sequence[Sequence[int]], rows: torch.Tensor, room: int) -> Prefilled:
        """Prefill U distinct prompts for N requests: rows [N] (int64) is each request's prompt index."""
        ...

    def decode(self, cache: DynamicCache, last: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
               room: int) -> Decoded:
        """One step: last [B] the tokens sampled and not yet in the cache, pos [B] their positions, mask [B, L+1]
        the cache's columns plus the new one."""
        ...

    def select(self, cache: DynamicCache, mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Keep only `rows` [R] of the cache (in place), drop the columns that became all padding; returns the mask
        [R, L'] (kv_cache.select's contract)."""
        ...
