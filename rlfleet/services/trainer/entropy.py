"""The policy's per-token entropy from the logits, computed next to the log-probs by the trainer's forwards.

The forward leaves it in `batch.extras["entropy"]` ([S, T] float32): without a graph (a metric) unless
`batch.extras["entropy_grad"]` is true and gradients are on (the entropy bonus, trainer.policy_loss.entropy_coef).
"""

from __future__ import annotations

import torch

from rlfleet.protocols import TrainBatch

ENTROPY = "entropy"             # batch.extras: [S, T] entropy of the distribution each response token was read from
ENTROPY_GRAD = "entropy_grad"   # batch.extras: True -> keep the entropy's graph (the loss uses it)


def entropy_from_logprobs(logp: torch.Tensor) -> torch.Tensor:
    """logp: [..., V] log-softmax output -> [...] entropy -sum_v p_v log p_v (0 * -inf counted as 0)."""
    safe = torch.where(torch.isfinite(logp), logp, torch.zeros((), device=logp.device))
    return -(torch.exp(logp) * safe).sum(-1)


def record_entropy(batch: TrainBatch, logp: torch.Tensor) -> None:
    """Store the entropy of logp [S, T, V] in batch.extras (with a graph only when the bonus needs it)."""
    if batch.extras.get(ENTROPY_GRAD) and torch.is_grad_enabled():
        batch.extras[ENTROPY] = entropy_from_logprobs(logp)
        return
    with torch.no_grad():
        batch.extras[ENTROPY] = entropy_from_logprobs(logp.detach())
