"""Policy losses. Built-in: the clipped policy-gradient loss with truncated importance sampling (TIS / icepop).

Aggregation is token-level over the *global* batch: every loss divides its sum over this rank's valid tokens by
`token_count`, the number of valid tokens on all data-parallel ranks together, so the sum of the ranks' losses is the
loss of the whole batch. Metrics follow the same rule (this rank's share of a global token mean): the trainer sums them
over ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlfleet.config import TisConfig, TrainerConfig
from rlfleet.protocols import LossFn, LossOutput, TrainBatch


def importance_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, tis: TisConfig
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance weights of trainer vs rollout policy, and where they were truncated.

    old_logprobs, rollout_logprobs: [S, T]. Returns (weights [S, T] float32 without grad, clipped [S, T] bool).
    tis: w = min(exp(old - rollout), clip); icepop: w = 1 where the ratio is in [low, clip], else 0; none: w = 1.
    """
    ratio = torch.exp(old_logprobs.detach().float() - rollout_logprobs.float())     # [S, T]
    if tis.mode == "tis":
        clipped = ratio > tis.clip
        return torch.clamp(ratio, max=tis.clip), clipped
    if tis.mode == "icepop":
        clipped = (ratio < tis.low) | (ratio > tis.clip)
        return (~clipped).to(torch.float32), clipped
    return torch.ones_like(ratio), torch.zeros_like(ratio, dtype=torch.bool)


@dataclass(frozen=True)
class ClippedPolicyLoss:
    """PPO-style clipped surrogate with asymmetric clip range [1 - clip_low, 1 + clip_high], times TIS weights."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    tis: TisConfig = TisConfig()

    def __call__(self, logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch,
                 token_count: float) -> LossOutput:
        # logprobs, advantages, batch.*_logprobs, batch.response_mask: [S, T]
        valid = batch.response_mask > 0                                                # [S, T] bool
        old = batch.old_logprobs if batch.old_logprobs is not None else logprobs.detach()
        denom = max(float(token_count), 1.0)
        zero = torch.zeros((), dtype=torch.float32, device=logprobs.device)

        def share(x: torch.Tensor) -> torch.Tensor:      # this rank's part of the global token mean
            return torch.where(valid, x.to(torch.float32), zero).sum() / denom

        ratio = torch.exp(logprobs - old)                                              # [S, T]
        unclipped = -advantages * ratio                                                # [S, T]
        clipped = -advantages * torch.clamp(ratio, 1.0 - self.clip_low, 1.0 + self.clip_high)
        per_token = torch.maximum(unclipped, clipped)                                  # [S, T]
        weights, weight_clipped = importance_weights(old, batch.rollout_logprobs, self.tis)
        loss = share(per_token * weights)
        metrics = {
            "pg_loss": float(loss.detach()),
            "ratio_mean": float(share(ratio.detach())),
            "clip_fraction": float(share((clipped > unclipped).detach())),
            "tis_weight_mean": float(share(weights)),
            "tis_clip_fraction": float(share(weight_clipped)),
            "logprob_abs_diff": float(share((old.detach() - batch.rollout_logprobs).abs())),
        }
        return LossOutput(loss=loss, metrics=metrics)


def clipped_pg(cfg: TrainerConfig) -> LossFn:
    return ClippedPolicyLoss(clip_low=cfg.clip_low, clip_high=cfg.clip_high, tis=cfg.tis)


# built-in loss name -> factory taking the trainer config
LOSSES = {"clipped_pg": clipped_pg}
