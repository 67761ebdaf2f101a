"""RMSNorm as one fused op in float32 training (`perf.trainer_fused_norm`, on by default).

transformers' Llama-family RMSNorm is five ops forward (cast, pow, mean, rsqrt and two multiplies) and as many
backward, each a pass over the activations. `F.rms_norm` is one kernel each way, with the same math in float32:
on the addition example's trainer step (4 layers, one Zen 4 core) 151 -> 140 and 161 -> 154 ms a step in two
alternated runs of `bench/trainer_step.py`-sized batches. The rollout engine's lean decode step already normalises
this way (both call rlfleet/cpu_kernels/rms_norm.py), so the trainer's logprobs move towards the engine's, not away.

`fuse_rms_norms(model)` swaps each such module for a FusedRMSNorm holding the same weight Parameter (the module
path and state-dict names are unchanged, so checkpoints, publishing and FSDP see no difference). It runs before
FSDP shards the model: FSDP registers its hooks and parameter swaps on the modules present then. Other dtypes
(a bf16 compute dtype) keep HF's order -- normalise in float32, cast, then scale -- so bf16 rounding is unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from rlfleet.cpu_kernels import fused_rms_norm

# transformers' RMSNorm classes whose forward is weight * x / sqrt(mean(x^2) + variance_epsilon)
FUSABLE = frozenset({"LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm"})


class FusedRMSNorm(nn.Module):
    """x [..., D] -> x / sqrt(mean(x^2) + eps) * weight [D], in one op for float32."""

    def __init__(self, weight: nn.Parameter, eps: float) -> None:
        super().__init__()
        self.weight = weight
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_rms_norm(x, self.weight, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


def fusable(module: nn.Module) -> bool:
    """Exactly one of transformers' own FUSABLE classes (a subclass may change the forward)."""
    cls = type(module)
    return cls.__name__ in FUSABLE and cls.__module__.startswith("transformers.models.")


def fuse_rms_norms(model: nn.Module) -> int:
    """Replace every fusable RMSNorm in `model` by a FusedRMSNorm on the same weight; returns how many."""
    swapped = 0
    for name, module in list(model.named_modules()):
        if not fusable(module):
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, FusedRMSNorm(module.weight, float(module.variance_epsilon)))
        swapped += 1
    return swapped
