"""What a step's batch looked like, from the samples themselves: the numbers people look for on a dashboard
(reward spread, response lengths, truncation, groups that give no gradient, the policy's entropy)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from rlfleet.sample import Status
from rlfleet.v1 import buffer_pb2


def batch_stats(batch: buffer_pb2.Batch) -> dict[str, float]:
    """reward_std; response_length_mean/max (tokens); truncation_rate (samples that hit max_new_tokens);
    equal_reward_groups (fraction of groups whose rewards are all equal: zero GRPO advantage, no gradient);
    entropy_estimate (mean over sampled tokens of -log p(token) under the rollout policy: an unbiased estimate of
    the per-token entropy when sampling at temperature 1)."""
    if not batch.samples:
        return {}
    rewards = np.array([s.reward for s in batch.samples], dtype=np.float64)              # [S]
    lengths = np.array([len(s.response_ids) // 4 for s in batch.samples], dtype=np.float64)   # [S]
    truncated = sum(1 for s in batch.samples if s.status == Status.TRUNCATED)
    groups: dict[str, list[float]] = defaultdict(list)
    for s in batch.samples:
        groups[s.group_id].append(s.reward)
    equal = sum(1 for rs in groups.values() if max(rs) - min(rs) <= 1e-9)
    logprobs = np.concatenate([np.frombuffer(s.rollout_logprobs, dtype="<f4") for s in batch.samples])   # [sum T]
    out = {"reward_std": float(rewards.std()), "response_length_mean": float(lengths.mean()),
           "response_length_max": float(lengths.max()), "truncation_rate": truncated / len(batch.samples),
           "equal_reward_groups": equal / len(groups)}
    if logprobs.size:
        out["entropy_estimate"] = float(-logprobs.mean())
    return out
