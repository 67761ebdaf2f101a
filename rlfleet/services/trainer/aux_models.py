"""Frozen models the trainer scores batches with: the reference model (KL penalty) and the distillation teacher.

Choice for on-policy distillation: the teacher's logprobs are computed here, in the trainer, from a teacher HF
folder (trainer.teacher.model_path), sharded with FSDP2 like the policy. A teacher served by a rollout replica would
save trainer memory, but needs a scoring RPC the rollout service does not have (Rollout.Generate samples, it does not
score given tokens) and an extra network hop per step; in-trainer scoring is exact, deterministic and resumable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from rlfleet.model_specs import ModuleSpec, apply_specs
from rlfleet.protocols import TrainBatch

ForwardFn = Callable[[torch.nn.Module, TrainBatch, float], torch.Tensor]
Shard = Callable[[torch.nn.Module], None]


class FrozenScorer:
    """A frozen causal LM: response-token logprobs [S, T] of a batch, without gradients."""

    def __init__(self, path: str | Path, device: torch.device, shard: Shard, forward: ForwardFn,
                 specs: Sequence[ModuleSpec] = ()) -> None:
        """specs: the policy's model.specs, for the reference model (the policy's own architecture)."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).to(device)
        apply_specs(model, specs)
        for p in model.parameters():
            p.requires_grad_(False)
        model.eval()
        shard(model)
        self.model, self._forward = model, forward

    def __call__(self, batch: TrainBatch, temperature: float) -> torch.Tensor:
        with torch.no_grad():
            return self._forward(self.model, batch, temperature).detach()          # [S, T]
