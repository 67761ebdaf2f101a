"""Advantage estimators: reward -> per-token advantages [S, T], zero where the response mask is zero."""

from __future__ import annotations

import torch

from rlfleet.protocols import AdvantageEstimator, TrainBatch

GRPO_EPS = 1e-6


def group_normalized_rewards(rewards: torch.Tensor, group_index: torch.Tensor, eps: float = GRPO_EPS) -> torch.Tensor:
    """(r - mean_g) / (std_g + eps) per group; std is the unbiased sample std (0 for a one-sample group).

    rewards: [S] float; group_index: [S] int64 in 0..G-1. Returns [S] float32.
    """
    rewards = rewards.to(torch.float32)
    if rewards.numel() == 0:
        return rewards.clone()
    num_groups = int(group_index.max().item()) + 1
    count = torch.zeros(num_groups).index_add_(0, group_index, torch.ones_like(rewards))     # [G]
    mean = torch.zeros(num_groups).index_add_(0, group_index, rewards) / count.clamp(min=1)  # [G]
    centered = rewards - mean[group_index]                                                  # [S]
    sq = torch.zeros(num_groups).index_add_(0, group_index, centered * centered)            # [G]
    std = (sq / (count - 1).clamp(min=1)).sqrt()                                            # [G]
    return centered / (std[group_index] + eps)                                              # [S]


def grpo(batch: TrainBatch) -> torch.Tensor:
    """GRPO: the group-normalised reward of each sample, broadcast over its response tokens. -> [S, T]"""
    per_sample = group_normalized_rewards(batch.rewards, batch.group_index)   # [S]
    return per_sample[:, None] * batch.response_mask.to(torch.float32)        # [S, T]


ADVANTAGES: dict[str, AdvantageEstimator] = {"grpo": grpo}
