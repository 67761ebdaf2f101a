"""Logits only where they are read. A causal LM's head runs on every position it is given, but the trainer reads
logits only at the positions that predict response tokens: from the earliest sample's last prompt token on. HF
causal LMs take `logits_to_keep=K` (the head runs on the last K positions only), so the trainer passes
K = L - first and reads position p at index p - first. On SmolLM2-135M (a 49,152-token vocabulary, a 28M-parameter
head) with the word problems' ~190-token prompts, the head was ~20% of the forward's FLOPs and most of it fell on
prompt positions. A model whose forward does not take `logits_to_keep` gets every position, as before."""

from __future__ import annotations

import inspect

import torch


def takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the model's forward has a `logits_to_keep` parameter (read each forward: ~20 us)."""
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def logits_window(model: torch.nn.Module, seq_len: int, first: int) -> tuple[int, dict[str, int]]:
    """(the first position the returned logits cover, the forward keyword arguments that make it so) for a forward
    over `seq_len` positions whose logits are read from position `first` on."""
    first = max(0, min(first, seq_len - 1))
    if first == 0 or not takes_logits_to_keep(model):
        return 0, {}
    return first, {"logits_to_keep": seq_len - first}
