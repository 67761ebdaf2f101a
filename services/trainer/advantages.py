"""Advantage estimators: a batch -> per-token advantages [S, T], zero where the response mask is zero.

Each is an `rlfleet.protocols.AdvantageEstimator`. Estimators that normalise over the whole batch (REINFORCE++,
PPO's GAE whitening) use `batch.extras["all_reduce_sum"]` when the trainer provides it (a collective summing a list
of floats over data-parallel ranks), so N ranks see the statistics of the global batch exactly like one rank does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from rlfleet.protocols import AdvantageEstimator, TrainBatch

GRPO_EPS = 1e-6
WHITEN_EPS = 1e-8
RETURNS = "returns"              # batch.extras key where GAE leaves the critic's targets [S, T]
ALL_REDUCE_SUM = "all_reduce_sum"

ReduceSum = Callable[[Sequence[float]], list[float]]


def group_normalized_rewards(rewards: torch.Tensor, group_index: torch.Tensor, eps: float = GRPO_EPS,
                             scale: bool = True) -> torch.Tensor:
    """(r - mean_g) / (std_g + eps) per group (scale=False: r - mean_g); std is the unbiased sample std
    (0 for a one-sample group).

    rewards: [S] float; group_index: [S] int64 in 0..G-1. Returns [S] float32.
    """
    rewards = rewards.to(torch.float32)
    if rewards.numel() == 0:
        return rewards.clone()
    num_groups = int(group_index.max().item()) + 1
    zeros = torch.zeros(num_groups, device=rewards.device)
    count = zeros.clone().index_add_(0, group_index, torch.ones_like(rewards))     # [G]
    mean = zeros.clone().index_add_(0, group_index, rewards) / count.clamp(min=1)  # [G]
    centered = rewards - mean[group_index]                                          # [S]
    if not scale:
        return centered
    sq = zeros.clone().index_add_(0, group_index, centered * centered)              # [G]
    std = (sq / (count - 1).clamp(min=1)).sqrt()                                    # [G]
    return centered / (std[group_index] + eps)                                      # [S]


def _broadcast(per_sample: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
    return per_sample[:, None] * batch.response_mask.to(torch.float32)             # [S] -> [S, T]


def _local_sum(values: Sequence[float]) -> list[float]:
    return list(values)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, reduce_sum: ReduceSum = _local_sum,
                  eps: float = WHITEN_EPS) -> torch.Tensor:
    """(x - mean) / (std + eps) over the masked tokens of the (global) batch; 0 where mask is 0.

    x, mask: [S, T]. The population std of the tokens (all equal -> 0 advantages).
    """
    m = mask.to(torch.float32)
    n, total = reduce_sum([float(m.sum()), float((x * m).sum())])
    if n <= 0:
        return torch.zeros_like(x)
    mean = total / n
    var = reduce_sum([float((((x - mean) ** 2) * m).sum())])[0] / n
    return (x - mean) / (var ** 0.5 + eps) * m


def _reduce(batch: TrainBatch) -> ReduceSum:
    return batch.extras.get(ALL_REDUCE_SUM, _local_sum)


def grpo(batch: TrainBatch) -> torch.Tensor:
    """GRPO: the group-normalised reward of each sample, broadcast over its response tokens. -> [S, T]"""
    return _broadcast(group_normalized_rewards(batch.rewards, batch.group_index), batch)


def drgrpo(batch: TrainBatch) -> torch.Tensor:
    """Dr. GRPO: r - mean_g without dividing by the group std (no difficulty bias). -> [S, T]"""
    return _broadcast(group_normalized_rewards(batch.rewards, batch.group_index, scale=False), batch)


def reinforce_pp(batch: TrainBatch) -> torch.Tensor:
    """REINFORCE++: the sequence reward (gamma = 1) on every token, whitened over the global batch. -> [S, T]"""
    return masked_whiten(_broadcast(batch.rewards.to(torch.float32), batch), batch.response_mask, _reduce(batch))


def reinforce_pp_baseline(batch: TrainBatch) -> torch.Tensor:
    """REINFORCE++-baseline: r - mean_g (group baseline), then whitened over the global batch. -> [S, T]"""
    centered = group_normalized_rewards(batch.rewards, batch.group_index, scale=False)     # [S]
    return masked_whiten(_broadcast(centered, batch), batch.response_mask, _reduce(batch))


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the response tokens; the reward arrives after the last valid token.

    rewards: [S]; values, mask: [S, T] (values[s, t] = V(state before token t)). Tokens past the last valid one are
    ignored; masked tokens inside the response take part in the recursion (their state still has a value).
    Returns (advantages [S, T], returns = advantages + values [S, T]), both zero where mask is zero.
    """
    s, t = mask.shape
    m = mask.to(torch.float32)
    if t == 0:
        return m.clone(), m.clone()
    idx = torch.arange(t, device=mask.device)[None, :].expand(s, t)                    # [S, T]
    last = torch.where(m > 0, idx, torch.full_like(idx, -1)).max(dim=1).values         # [S], -1 if none
    alive = (idx <= last[:, None]).to(torch.float32)                                   # [S, T]
    v = values.to(torch.float32) * alive
    r = torch.zeros_like(m)
    has = last >= 0
    r[has, last[has]] = rewards.to(torch.float32)[has]                                  # reward at the last token
    adv = torch.zeros_like(m)
    running = torch.zeros(s, device=mask.device)
    for i in range(t - 1, -1, -1):
        next_v = v[:, i + 1] if i + 1 < t else torch.zeros(s, device=mask.device)
        delta = r[:, i] + gamma * next_v - v[:, i]
        running = (delta + gamma * lam * running) * alive[:, i]
        adv[:, i] = running
    returns = (adv + v) * m
    return adv * m, returns


class Gae:
    """PPO with a critic: GAE from batch.values [S, T], whitened over the global batch; leaves the critic's targets
    (unwhitened advantages + values) in batch.extras["returns"]."""

    def __init__(self, gamma: float = 1.0, lam: float = 0.95) -> None:
        self.gamma, self.lam = gamma, lam

    def __call__(self, batch: TrainBatch) -> torch.Tensor:
        if batch.values is None:
            raise ValueError("advantage 'gae' needs critic values: set trainer.algorithm: ppo (it loads the critic)")
        adv, returns = gae_advantages(batch.rewards, batch.values, batch.response_mask, self.gamma, self.lam)
        batch.extras[RETURNS] = returns
        return masked_whiten(adv, batch.response_mask, _reduce(batch))


def distill(batch: TrainBatch) -> torch.Tensor:
    """On-policy distillation (reverse KL): per-token advantage teacher_logprob - student_logprob. -> [S, T]

    Maximising it with the policy gradient minimises KL(student || teacher) on the student's own samples.
    """
    if batch.teacher_logprobs is None or batch.old_logprobs is None:
        raise ValueError("advantage 'distill' needs teacher logprobs: set trainer.teacher.model_path")
    m = batch.response_mask.to(torch.float32)
    return (batch.teacher_logprobs.float() - batch.old_logprobs.float()) * m


def sft(batch: TrainBatch) -> torch.Tensor:
    """SFT: 1 on every response token (the loss is plain next-token likelihood). -> [S, T]"""
    return batch.response_mask.to(torch.float32).clone()


ADVANTAGES: dict[str, AdvantageEstimator] = {
    "grpo": grpo, "drgrpo": drgrpo, "reinforce_pp": reinforce_pp, "reinforce_pp_baseline": reinforce_pp_baseline,
    "distill": distill, "sft": sft,
}
