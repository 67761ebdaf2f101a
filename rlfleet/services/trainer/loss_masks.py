"""TRL's masks of the policy-loss term (trainer.masking), wrapped around any loss as the advantages it sees: a
masked token's advantage is 0, so a loss that is 0 with no gradient at a zero advantage (every built-in policy loss
but kl_cov's |log r| penalty, which a masked token then still pays) leaves the token out of its numerator while its
denominator still counts it, as TRL multiplies per_token_loss by the mask before aggregating. The KL penalty wraps
outside and is not masked (TRL's order); the entropy bonus covers the entropy-kept tokens (losses.EntropyTerm).
The masked loss's clip metrics count masked tokens as unclipped (TRL counts them by their real advantage).

- Entropy mask (TRL's top_entropy_quantile q < 1): keep the tokens whose entropy (batch.extras["entropy"], from the
  forward) is >= the (1 - q) quantile of this batch's valid tokens (torch.quantile, linear interpolation).
- Off-policy sequence mask (DeepSeek-V3.2's OPSM, TRL's off_policy_mask_threshold delta): drop the tokens with
  A < 0 of a sequence whose mean log(pi_rollout / pi_theta) over its valid tokens exceeds delta.
Metrics: entropy_mask_fraction / off_policy_mask_fraction, the valid tokens kept (a global token mean).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlfleet.config import MaskingConfig
from rlfleet.protocols import LossFn, LossOutput, TrainBatch
from rlfleet.services.trainer.entropy import ENTROPY, high_entropy_mask
from rlfleet.services.trainer.losses import _token_share, metric_tokens


def off_policy_sequence_mask(advantages: torch.Tensor, logprobs: torch.Tensor, rollout: torch.Tensor,
                             valid: torch.Tensor, threshold: float) -> torch.Tensor:
    """TRL's get_off_policy_mask: keep where A >= 0 or the sequence's mean log(pi_rollout / pi) <= threshold.
    advantages, logprobs, rollout, valid: [S, T] -> [S, T] bool."""
    zero = torch.zeros((), device=logprobs.device)
    kl = torch.where(valid, rollout.float() - logprobs.detach().float(), zero)      # [S, T]
    mean_kl = kl.sum(1) / valid.sum(1).clamp(min=1)                                 # [S]
    return (advantages >= 0) | (mean_kl <= threshold)[:, None]


@dataclass(frozen=True)
class MaskedLoss:
    """inner loss on the advantages zeroed outside the kept tokens (see the module doc)."""

    inner: LossFn
    top_entropy_quantile: float = 1.0
    off_policy_threshold: float | None = None

    def __call__(self, logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch,
                 token_count: float) -> LossOutput:
        valid = batch.response_mask > 0                                              # [S, T]
        keep = torch.ones_like(valid)                                                # [S, T]
        share = _token_share(valid, metric_tokens(batch, token_count))
        metrics: dict[str, float] = {}
        if self.top_entropy_quantile < 1.0:
            entropy = batch.extras.get(ENTROPY)
            if not isinstance(entropy, torch.Tensor) or entropy.shape != valid.shape:
                raise ValueError("trainer.masking.top_entropy_quantile < 1 needs the forward's entropy "
                                 "(this backend does not provide it)")
            by_entropy = high_entropy_mask(entropy, valid, self.top_entropy_quantile)
            keep &= by_entropy
            metrics["entropy_mask_fraction"] = float(share(by_entropy))
        if self.off_policy_threshold is not None:
            by_policy = off_policy_sequence_mask(advantages, logprobs, batch.rollout_logprobs, valid,
                                                 self.off_policy_threshold)
            keep &= by_policy
            metrics["off_policy_mask_fraction"] = float(share(by_policy))
        out = self.inner(logprobs, torch.where(keep, advantages, torch.zeros_like(advantages)), batch, token_count)
        return LossOutput(loss=out.loss, metrics={**out.metrics, **metrics})


def masked_loss(loss: LossFn, masking: MaskingConfig) -> LossFn:
    """`loss` itself when trainer.masking masks nothing, else wrapped in MaskedLoss."""
    if masking.top_entropy_quantile >= 1.0 and masking.off_policy_threshold is None:
        return loss
    return MaskedLoss(loss, masking.top_entropy_quantile, masking.off_policy_threshold)
