"""verl's outcome estimators with a baseline other than the group mean, each an
`rlfleet.protocols.AdvantageEstimator` (trainer.advantage names; ADVANTAGE_SPECS in the SDK):

- opo (On-Policy RL with Optimal reward baseline, verl compute_opo_outcome_advantage): A_i = score_i - b_g with
  the length-weighted group baseline b_g = sum_j |y_j| score_j / sum_j |y_j| (|y| = valid response tokens; a
  one-sample group: b = 0), broadcast over the response tokens; no std.
- gpg (GPG, verl compute_gpg_outcome_advantage): A_i = alpha * (score_i - mean_g), alpha = the global batch's
  samples / its samples with a nonzero score (a one-sample group: mean 0), broadcast over the tokens; no std.
- remax (ReMax, verl compute_remax_outcome_advantage): A_t = sum_{t' >= t} r_t' - b, the return-to-go of the
  per-token rewards minus the reward b of a greedy (temperature 0) response to the same prompt, read from
  batch.extras["reward_baselines"] [S]: the rollout generates and scores that greedy response once per group (its
  spec declares needs_reward_baseline) and sets its reward on every sample of the group (Sample.reward_baseline);
  the greedy response is not trained on (rlfleet/services/trainer/reward_baselines.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlfleet.config import TrainerConfig
from rlfleet.protocols import AdvantageEstimator, TrainBatch
from rlfleet.services.trainer.advantages import _broadcast, _reduce, sequence_scores, token_rewards
from rlfleet.services.trainer.reward_baselines import REWARD_BASELINES


def opo_rewards(scores: torch.Tensor, lengths: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """scores, lengths [S] float, group_index [S] int64 -> [S] score - length-weighted group mean (0 baseline for a
    one-sample group; a group of empty responses: the plain mean)."""
    scores, lengths = scores.to(torch.float32), lengths.to(torch.float32)
    if scores.numel() == 0:
        return scores.clone()
    groups = int(group_index.max().item()) + 1
    zeros = torch.zeros(groups, device=scores.device)
    count = zeros.clone().index_add_(0, group_index, torch.ones_like(scores))              # [G]
    total_len = zeros.clone().index_add_(0, group_index, lengths)                          # [G]
    weighted = zeros.clone().index_add_(0, group_index, lengths * scores)                  # [G]
    plain = zeros.clone().index_add_(0, group_index, scores) / count.clamp(min=1)          # [G]
    baseline = torch.where(total_len > 0, weighted / total_len.clamp(min=1e-12), plain)     # [G]
    baseline = torch.where(count < 2, torch.zeros_like(baseline), baseline)
    return scores - baseline[group_index]


def opo(batch: TrainBatch) -> torch.Tensor:
    """OPO: score minus the length-weighted group baseline, broadcast over the tokens. -> [S, T]"""
    lengths = batch.response_mask.sum(1)                                                    # [S]
    return _broadcast(opo_rewards(sequence_scores(batch), lengths, batch.group_index), batch)


def gpg_rewards(scores: torch.Tensor, group_index: torch.Tensor, samples: float, nonzero: float) -> torch.Tensor:
    """scores [S], group_index [S] -> [S] alpha * (score - group mean), alpha = samples / max(nonzero, 1) (the
    global batch's counts); a one-sample group's mean is 0."""
    scores = scores.to(torch.float32)
    if scores.numel() == 0:
        return scores.clone()
    groups = int(group_index.max().item()) + 1
    zeros = torch.zeros(groups, device=scores.device)
    count = zeros.clone().index_add_(0, group_index, torch.ones_like(scores))              # [G]
    mean = zeros.clone().index_add_(0, group_index, scores) / count.clamp(min=1)           # [G]
    mean = torch.where(count < 2, torch.zeros_like(mean), mean)
    return samples / max(nonzero, 1.0) * (scores - mean[group_index])


def gpg(batch: TrainBatch) -> torch.Tensor:
    """GPG: alpha * (score - group mean), broadcast over the tokens. -> [S, T]"""
    scores = sequence_scores(batch)                                                         # [S]
    samples, nonzero = _reduce(batch)([float(scores.numel()), float((scores != 0).sum())])
    return _broadcast(gpg_rewards(scores, batch.group_index, samples, nonzero), batch)


def remax(batch: TrainBatch) -> torch.Tensor:
    """ReMax: return-to-go of the per-token rewards minus the greedy baseline reward. -> [S, T]"""
    baselines = batch.extras.get(REWARD_BASELINES)
    if not isinstance(baselines, torch.Tensor):
        raise ValueError("advantage 'remax' needs the greedy response's reward of each prompt "
                         f"(batch.extras[{REWARD_BASELINES!r}]); a sample of this batch carries no reward_baseline "
                         "(the rollout sets it when the estimator's spec declares needs_reward_baseline)")
    m = batch.response_mask.to(torch.float32)                                               # [S, T]
    returns = token_rewards(batch).flip(-1).cumsum(-1).flip(-1)                             # [S, T]
    return (returns - baselines.to(torch.float32)[:, None]) * m


def _fixed(estimator: AdvantageEstimator) -> Callable[[TrainerConfig], AdvantageEstimator]:
    return lambda cfg: estimator


# advantage name -> factory taking the trainer config (merged into algorithms.ADVANTAGE_FACTORIES)
ESTIMATOR_FACTORIES: dict[str, Callable[[TrainerConfig], AdvantageEstimator]] = {
    "opo": _fixed(opo), "gpg": _fixed(gpg), "remax": _fixed(remax),
}
