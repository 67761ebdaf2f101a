"""LoRA for the trainer: rank-r adapters on target nn.Linear layers; only the adapters train.

A target Linear `...q_proj` becomes a LoraLinear that keeps its `weight` / `bias` (same state-dict names, frozen)
and adds `lora_A` [r, in] and `lora_B` [out, r]:  y = x W^T + b + (alpha / r) * x A^T B^T.  B starts at zero, so
the adapted model equals the base model at step 0. The rollout side merges W + (alpha / r) * B @ A
(rlfleet/services/rollout/engines/lora.py). Our own small module rather than peft: no extra dependency, state-dict names
we control (the publisher and `rlfleet convert` rely on them), and it shards under FSDP2 like any Linear.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

ADAPTER_SUFFIXES = (".lora_A", ".lora_B")


class LoraLinear(nn.Linear):
    """nn.Linear with a frozen base weight and trainable low-rank adapters."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, generator: torch.Generator) -> None:
        super().__init__(base.in_features, base.out_features, bias=base.bias is not None,
                         device=base.weight.device, dtype=base.weight.dtype)
        self.weight = base.weight
        self.weight.requires_grad_(False)
        if base.bias is not None:
            self.bias = base.bias
            self.bias.requires_grad_(False)
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        a = torch.empty(rank, base.in_features, dtype=base.weight.dtype)
        bound = 1.0 / math.sqrt(base.in_features)                     # kaiming_uniform(a=sqrt(5)) as nn.Linear
        a.uniform_(-bound, bound, generator=generator)
        self.lora_A = nn.Parameter(a.to(base.weight.device))                                   # [r, in]
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=base.weight.dtype,
                                               device=base.weight.device))                     # [out, r]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in] -> [..., out]
        return super().forward(x) + (x @ self.lora_A.T @ self.lora_B.T) * self.scale


def apply_lora(model: nn.Module, rank: int, alpha: float, targets: Sequence[str], seed: int) -> list[str]:
    """Freeze every parameter, then replace each target Linear (by the last part of its name) with a LoraLinear.

    Deterministic in `seed`, so every FSDP rank builds the same adapters. Returns the replaced module names.
    """
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    for p in model.parameters():
        p.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    wanted = set(targets)
    replaced = []
    for name, module in list(model.named_modules()):
        if name.rsplit(".", 1)[-1] in wanted and isinstance(module, nn.Linear) and not isinstance(module, LoraLinear):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, LoraLinear(module, rank, alpha, generator))
            replaced.append(name)
    if not replaced:
        raise ValueError(f"LoRA: no nn.Linear named any of {sorted(wanted)} in {type(model).__name__}")
    return replaced


def is_adapter(name: str) -> bool:
    return name.endswith(ADAPTER_SUFFIXES)


def merge_adapters(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A full state dict with adapters -> plain weights W + scale * B @ A, adapter tensors removed."""
    out = {k: v for k, v in state.items() if not is_adapter(k)}
    for name in state:
        if name.endswith(".lora_A"):
            prefix = name[: -len(".lora_A")]
            a, b = state[name].float(), state[prefix + ".lora_B"].float()          # [r, in], [out, r]
            w = out[prefix + ".weight"]
            out[prefix + ".weight"] = (w.float() + scale * (b @ a)).to(w.dtype)
    return out
