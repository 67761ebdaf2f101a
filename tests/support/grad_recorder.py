"""A trainer hook for tests that compare two ways of computing one optimizer step."""

from __future__ import annotations

import torch

from rlfleet.protocols import TrainBatch


class GradRecorder:
    """before_step hook: keeps each parameter's gradient (after backward, before clipping) and the batch's old
    logprobs [S, T] (None when the step set none)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.grads: dict[str, torch.Tensor] = {}
        self.old: torch.Tensor | None = None

    def before_step(self, step: int, batch: TrainBatch) -> None:
        self.grads = {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}
        self.old = batch.old_logprobs.detach().clone() if batch.old_logprobs is not None else None
