"""Switching a transformers model from SDPA attention to a variant of it: the trainer's attention functions
(cpu_attention.py: float32 attention under bf16; grid_attention.py: the unpadded shared layout) are registered with
transformers' attention registry (`AttentionInterface`, the documented plug point) under their own name, with the
SDPA mask builder, and set on the model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def swap_sdpa(model: Any, name: str, attention: Callable[..., Any]) -> bool:
    """Switch a model that uses SDPA attention to `attention` under `name` (registering it first); True if it was
    switched, False for a model on any other attention (left as it is)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    if getattr(getattr(model, "config", None), "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, sdpa_mask)
    model.set_attn_implementation(name)
    return True
