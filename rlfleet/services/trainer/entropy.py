"""The policy's per-token entropy from the logits, computed next to the log-probs by the trainer's forwards.

The forward leaves it in `batch.extras["entropy"]` ([S, T] float32): without a graph (a metric) unless
`batch.extras["entropy_grad"]` is true and gradients are on (the entropy bonus, trainer.policy_loss.entropy_coef).
high_entropy_mask picks TRL's top-entropy tokens (trainer.masking.top_entropy_quantile).
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


def high_entropy_mask(entropy: torch.Tensor, valid: torch.Tensor, quantile: float) -> torch.Tensor:
    """TRL's get_high_entropy_mask: entropy >= the (1 - quantile) quantile of the valid tokens' entropies, and
    valid. entropy, valid: [S, T] -> [S, T] bool (none kept when no token is valid)."""
    values = entropy.detach().float()[valid]
    if values.numel() == 0:
        return torch.zeros_like(valid)
    threshold = torch.quantile(values, 1.0 - quantile)
    return (entropy.detach() >= threshold) & valid
