"""Advantage estimators: a batch -> per-token advantages [S, T], zero where the response mask is zero.

Each is an `rlfleet.protocols.AdvantageEstimator`. Estimators that normalise over the whole batch (REINFORCE++,
PPO's GAE whitening, GRPO's batch std) use `batch.extras["all_reduce_sum"]` when the trainer provides it (a
collective summing a list of floats over data-parallel ranks), so N ranks see the statistics of the global batch
exactly like one rank does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rlfleet.protocols import AdvantageEstimator, TrainBatch

GRPO_EPS = 1e-6
WHITEN_EPS = 1e-8
RETURNS = "returns"              # batch.extras key where GAE leaves the critic's targets [S, T]
ALL_REDUCE_SUM = "all_reduce_sum"
TOKEN_REWARDS = "token_rewards"  # batch.extras: [S, T] per-token rewards (the KL-in-reward penalty), else absent

ReduceSum = Callable[[Sequence[float]], list[float]]


def _local_sum(values: Sequence[float]) -> list[float]:
    return list(values)


def _group_stats(rewards: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rewards [S], group_index [S] -> per-sample (group size, group mean, unbiased group std; 0 for one sample)."""
    num_groups = int(group_index.max().item()) + 1
    zeros = torch.zeros(num_groups, device=rewards.device)
    count = zeros.clone().index_add_(0, group_index, torch.ones_like(rewards))     # [G]
    mean = zeros.clone().index_add_(0, group_index, rewards) / count.clamp(min=1)  # [G]
    centered = rewards - mean[group_index]                                          # [S]
    sq = zeros.clone().index_add_(0, group_index, centered * centered)              # [G]
    std = (sq / (count - 1).clamp(min=1)).sqrt()                                    # [G]
    return count[group_index], mean[group_index], std[group_index]


def _batch_std(rewards: torch.Tensor, reduce_sum: ReduceSum) -> float:
    """Unbiased std of the rewards of the global batch (TRL's scale_rewards="batch")."""
    n, total = reduce_sum([float(rewards.numel()), float(rewards.sum())])
    if n < 2:
        return 0.0
    mean = total / n
    sq = reduce_sum([float(((rewards - mean) ** 2).sum())])[0]
    return (sq / (n - 1)) ** 0.5


def group_normalized_rewards(rewards: torch.Tensor, group_index: torch.Tensor, eps: float = GRPO_EPS,
                             scale: bool | str = True, reduce_sum: ReduceSum = _local_sum,
                             single: str = "reward") -> torch.Tensor:
    """(r - mean_g) / (std + eps): std per group (scale True / "group"; the unbiased sample std), over the global
    batch ("batch", TRL's scale_rewards="batch"), or none (False / "none": r - mean_g). A one-sample group has no
    baseline: its advantage is the raw reward (single "reward", verl) or 0 (single "zero": TRL, r - its own mean).

    rewards: [S] float; group_index: [S] int64 in 0..G-1. Returns [S] float32.
    """
    rewards = rewards.to(torch.float32)
    if rewards.numel() == 0:
        return rewards.clone()
    mode = "group" if scale is True else "none" if scale is False else scale
    count, mean, std = _group_stats(rewards, group_index)
    alone = count < 2
    centered = rewards - mean                                                       # [S]
    if mode == "group":
        centered = centered / (std + eps)
    elif mode == "batch":
        centered = centered / (_batch_std(rewards, reduce_sum) + eps)
    elif mode != "none":
        raise ValueError(f"trainer.estimator.scale_rewards {mode!r}: group, batch or none")
    if single not in ("reward", "zero"):
        raise ValueError(f"trainer.estimator.single_sample {single!r}: reward or zero")
    return torch.where(alone, rewards if single == "reward" else torch.zeros_like(rewards), centered)


def rloo_rewards(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """RLOO: r_i - mean of the other samples of its group = n / (n - 1) * (r_i - mean_g); raw reward for a
    one-sample group. [S] -> [S] float32."""
    rewards = rewards.to(torch.float32)
    if rewards.numel() == 0:
        return rewards.clone()
    count, mean, _ = _group_stats(rewards, group_index)
    loo = (rewards - mean) * count / (count - 1).clamp(min=1)
    return torch.where(count < 2, rewards, loo)


def _broadcast(per_sample: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
    return per_sample[:, None] * batch.response_mask.to(torch.float32)             # [S] -> [S, T]


WHITEN_STD = ("population", "bessel")


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, reduce_sum: ReduceSum = _local_sum,
                  eps: float = WHITEN_EPS, std: str = "population") -> torch.Tensor:
    """Whiten x over the masked tokens of the (global) batch; 0 where mask is 0. x, mask: [S, T].

    std "population": (x - mean) / (sqrt(var) + eps), var the population variance (all equal -> 0 advantages);
    "bessel": verl's masked_whiten, (x - mean) * rsqrt(var * n / (n - 1) + eps) (one token: the population var).
    """
    if std not in WHITEN_STD:
        raise ValueError(f"trainer.estimator.whiten_std {std!r}: population or bessel")
    m = mask.to(torch.float32)
    n, total = reduce_sum([float(m.sum()), float((x * m).sum())])
    if n <= 0:
        return torch.zeros_like(x)
    mean = total / n
    var = reduce_sum([float((((x - mean) ** 2) * m).sum())])[0] / n
    if std == "bessel":
        var = var * n / (n - 1) if n > 1 else var
        return (x - mean) / (var + eps) ** 0.5 * m
    return (x - mean) / (var ** 0.5 + eps) * m


def _reduce(batch: TrainBatch) -> ReduceSum:
    return batch.extras.get(ALL_REDUCE_SUM, _local_sum)


def last_valid_index(mask: torch.Tensor) -> torch.Tensor:
    """mask [S, T] -> [S] index of the last valid token of each row (-1 when none)."""
    s, t = mask.shape
    idx = torch.arange(t, device=mask.device)[None, :].expand(s, t)
    return torch.where(mask > 0, idx, torch.full_like(idx, -1)).max(dim=1).values if t else \
        torch.full((s,), -1, dtype=torch.int64, device=mask.device)


def token_rewards(batch: TrainBatch) -> torch.Tensor:
    """[S, T]: the sequence reward on the last valid token, plus batch.extras["token_rewards"] (the per-token
    KL-in-reward penalty) when present; 0 where the mask is 0."""
    m = batch.response_mask.to(torch.float32)
    r = torch.zeros_like(m)
    last = last_valid_index(m)
    has = last >= 0
    r[has, last[has]] = batch.rewards.to(torch.float32)[has]
    extra = batch.extras.get(TOKEN_REWARDS)
    if isinstance(extra, torch.Tensor):
        r = r + extra.to(torch.float32)
    return r * m


def sequence_scores(batch: TrainBatch) -> torch.Tensor:
    """[S] the outcome score of each sample: its reward, plus the summed per-token rewards when present (verl's
    token_level_rewards.sum(-1))."""
    if isinstance(batch.extras.get(TOKEN_REWARDS), torch.Tensor):
        return token_rewards(batch).sum(1)
    return batch.rewards.to(torch.float32)


@dataclass(frozen=True)
class Grpo:
    """GRPO: the group-normalised score of each sample, broadcast over its response tokens. -> [S, T]

    scale_rewards: "group" (per-group std), "batch" (std of the global batch) or "none" (Dr. GRPO)."""

    scale_rewards: str = "group"
    std_eps: float = GRPO_EPS
    single_sample: str = "reward"

    def __call__(self, batch: TrainBatch) -> torch.Tensor:
        adv = group_normalized_rewards(sequence_scores(batch), batch.group_index, eps=self.std_eps,
                                       scale=self.scale_rewards, reduce_sum=_reduce(batch),
                                       single=self.single_sample)
        return _broadcast(adv, batch)


grpo = Grpo("group")
drgrpo = Grpo("none")            # Dr. GRPO: r - mean_g without dividing by the std (no difficulty bias)


def rloo(batch: TrainBatch) -> torch.Tensor:
    """RLOO: the leave-one-out baseline r_i - mean_{j != i} r_j of the group, broadcast over the tokens. -> [S, T]"""
    return _broadcast(rloo_rewards(sequence_scores(batch), batch.group_index), batch)


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_next over the valid tokens, carried unchanged through masked tokens (a tool turn
    inside the response does not count as a step). rewards, mask: [S, T] -> [S, T], 0 where mask is 0."""
    m = mask.to(torch.float32)
    out = torch.zeros_like(m)
    running = torch.zeros(m.shape[0], device=m.device)
    for i in range(m.shape[1] - 1, -1, -1):
        ret = rewards[:, i].float() + gamma * running
        running = torch.where(m[:, i] > 0, ret, running)
        out[:, i] = ret
    return out * m


@dataclass(frozen=True)
class ReinforcePP:
    """REINFORCE++: the discounted return of the token rewards (gamma; 1 = the sequence reward on every token),
    whitened over the global batch. -> [S, T]"""

    gamma: float = 1.0
    whiten_std: str = "population"

    def __call__(self, batch: TrainBatch) -> torch.Tensor:
        returns = discounted_returns(token_rewards(batch), batch.response_mask, self.gamma)
        return masked_whiten(returns, batch.response_mask, _reduce(batch), std=self.whiten_std)


reinforce_pp = ReinforcePP(1.0)


@dataclass(frozen=True)
class ReinforcePPBaseline:
    """REINFORCE++-baseline: score - mean_g (group baseline), then whitened over the global batch. -> [S, T]"""

    whiten_std: str = "population"

    def __call__(self, batch: TrainBatch) -> torch.Tensor:
        centered = group_normalized_rewards(sequence_scores(batch), batch.group_index, scale=False)     # [S]
        return masked_whiten(_broadcast(centered, batch), batch.response_mask, _reduce(batch), std=self.whiten_std)


reinforce_pp_baseline = ReinforcePPBaseline()


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float,
                   token_level: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the valid response tokens; the reward arrives at the last valid token.

    rewards: [S]; values, mask: [S, T] (values[s, t] = V(state before token t)); token_level: [S, T] per-token
    rewards that replace `rewards` when given. Masked tokens (tool output inside a response, padding) are skipped
    as verl does: the next value and the running advantage are carried through them unchanged, so neither an
    untrained value nor a gamma*lambda decay comes from a token the policy did not produce.
    Returns (advantages [S, T], returns = advantages + values [S, T]), both zero where mask is zero.
    """
    s, t = mask.shape
    m = mask.to(torch.float32)
    if t == 0:
        return m.clone(), m.clone()
    if token_level is None:
        r = torch.zeros_like(m)
        last = last_valid_index(m)
        has = last >= 0
        r[has, last[has]] = rewards.to(torch.float32)[has]                              # reward at the last token
    else:
        r = token_level.to(torch.float32) * m
    v = values.to(torch.float32)
    adv = torch.zeros_like(m)
    next_v = torch.zeros(s, device=mask.device)
    running = torch.zeros(s, device=mask.device)
    for i in range(t - 1, -1, -1):
        valid = m[:, i] > 0
        delta = r[:, i] + gamma * next_v - v[:, i]
        running = torch.where(valid, delta + gamma * lam * running, running)
        next_v = torch.where(valid, v[:, i], next_v)
        adv[:, i] = running
    returns = (adv + v) * m
    return adv * m, returns


class Gae:
    """PPO with a critic: GAE from batch.values [S, T], whitened over the global batch; leaves the critic's targets
    (unwhitened advantages + values) in batch.extras["returns"]."""

    def __init__(self, gamma: float = 1.0, lam: float = 0.95, whiten_std: str = "population") -> None:
        self.gamma, self.lam, self.whiten_std = gamma, lam, whiten_std

    def __call__(self, batch: TrainBatch) -> torch.Tensor:
        if batch.values is None:
            raise ValueError("advantage 'gae' needs critic values: set trainer.algorithm: ppo (it loads the critic)")
        token_level = token_rewards(batch) if isinstance(batch.extras.get(TOKEN_REWARDS), torch.Tensor) else None
        adv, returns = gae_advantages(batch.rewards, batch.values, batch.response_mask, self.gamma, self.lam,
                                      token_level)
        batch.extras[RETURNS] = returns
        return masked_whiten(adv, batch.response_mask, _reduce(batch), std=self.whiten_std)


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
    "grpo": grpo, "drgrpo": drgrpo, "rloo": rloo, "reinforce_pp": reinforce_pp,
    "reinforce_pp_baseline": reinforce_pp_baseline, "distill": distill, "sft": sft,
}
