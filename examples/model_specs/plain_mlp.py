"""A model spec (model.specs): the Llama MLP re-implemented in plain torch, swapped into every decoder layer.

`PlainMlp.from_module` takes over the original LlamaMLP's three projections (their parameters keep their names, so
checkpoints, weight publishing and the engine's weight loads are unchanged), and its forward writes SwiGLU out as
matmuls and a sigmoid: down(silu(gate(x)) * up(x)). The logprobs of the swapped model equal the original's to float32
rounding, in the trainer's forward and the torch engine's decode (tests/unit/model_specs/test_example_spec.py).
Replace the forward with your own block (a new activation, a mixture of experts) the same way.
"""

from __future__ import annotations

import torch
from torch import nn


class PlainMlp(nn.Module):
    """SwiGLU MLP over the original module's gate_proj, up_proj and down_proj."""

    def __init__(self, gate_proj: nn.Linear, up_proj: nn.Linear, down_proj: nn.Linear) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj

    @classmethod
    def from_module(cls, original: nn.Module, path: str) -> PlainMlp:
        act = type(getattr(original, "act_fn", None)).__name__
        if act not in ("SiLU", "SiLUActivation"):
            raise ValueError(f"{path}: PlainMlp re-implements a SiLU-gated MLP; this one's activation is {act}")
        return cls(original.gate_proj, original.up_proj, original.down_proj)

    @staticmethod
    def _linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
        out = x @ layer.weight.t()                                   # [..., out]
        return out + layer.bias if layer.bias is not None else out

    def forward(self, x: torch.Tensor) -> torch.Tensor:             # x: [B, L, H]
        gate = self._linear(x, self.gate_proj)                       # [B, L, I]
        up = self._linear(x, self.up_proj)                           # [B, L, I]
        return self._linear(gate * torch.sigmoid(gate) * up, self.down_proj)   # [B, L, H]
