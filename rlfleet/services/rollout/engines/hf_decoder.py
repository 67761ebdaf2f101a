"""The plain Decoder: the HF modules' own forward on any causal LM, with a left-padded prefill and MoE routes.

The torch engine decodes through it wherever the lean Llama-family path does not apply (`perf.engine_fast_decode:
false`, `trainer.on_policy`, MoE models, architectures lean_llama.supports refuses). Rows leave through
kv_cache.select.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.cache_utils import DynamicCache

from rlfleet.services.rollout.engines import kv_cache
from rlfleet.services.rollout.engines.decoder import Decoded, Prefilled
from rlfleet.services.rollout.engines.moe_routes import RouteRecorder


class HFDecoder:
    """Decoder through `model(...)`. routes: the model's router hooks (MoE models: routes come with each forward),
    else None."""

    def __init__(self, model: torch.nn.Module, device: torch.device, routes: RouteRecorder | None) -> None:
        self.model = model
        self.device = device
        self.routes = routes

    def prefill(self, prompts: Sequence[Sequence[int]], rows: torch.Tensor, room: int) -> Prefilled:
        """One forward over the prompts left-padded to the longest; equal prompts' rows copied out afterwards."""
        length = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), length, dtype=torch.long)               # [U, P] left-padded
        mask = torch.zeros(len(prompts), length, dtype=torch.long)              # [U, P]
        for i, prompt in enumerate(prompts):
            ids[i, length - len(prompt):] = torch.tensor(prompt)
            mask[i, length - len(prompt):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(1) - 1).clamp(min=0)                                  # [U, P]
        cache = DynamicCache(config=self.model.config)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True,
                         logits_to_keep=1)
        logits = out.logits[:, -1]                                               # [U, V]
        routes = self.routes.take(len(prompts), length)[:, -1] if self.routes is not None else None  # [U, layers, K]
        if len(prompts) < rows.shape[0]:                                         # copy each prompt's rows out
            mask = kv_cache.select(out.cache, mask, rows)                        # [N, P]
            logits = logits[rows]                                                # [N, V]
            routes = routes[rows.cpu()] if routes is not None else None          # [N, layers, K]
        return Prefilled(cache=out.cache, mask=mask, logits=logits, routes=routes)

    def decode(self, cache: DynamicCache, last: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
               room: int) -> Decoded:
        out = self.model(input_ids=last.unsqueeze(1), attention_mask=mask, position_ids=pos.unsqueeze(1), cache=cache,
                         use_cache=True)
        routes = self.routes.take(last.shape[0], 1)[:, 0] if self.routes is not None else None   # [B, layers, K]
        return Decoded(cache=out.cache, logits=out.logits[:, -1], routes=routes)                 # logits: [B, V]

    def select(self, cache: DynamicCache, mask: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return kv_cache.select(cache, mask, rows)
