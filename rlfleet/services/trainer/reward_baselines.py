"""The greedy baseline rewards of a TrainBatch (ReMax: trainer.advantage remax).

The rollout sets each sample's reward_baseline to the reward of a greedy (temperature 0) response to its prompt when
the trainer's estimator needs it (AdvantageSpec.needs_reward_baseline); the greedy response itself is never put, so
it is not trained on. build_train_batch lays the values out in batch.extras[REWARD_BASELINES] when every sample
carries one; a batch where some do not has no such key, and the remax estimator refuses it with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlfleet.sample import Sample

REWARD_BASELINES = "reward_baselines"    # batch.extras: [S] float32, the greedy response's reward of each row's prompt


def reward_baselines_extras(samples: Sequence[Sample]) -> dict[str, torch.Tensor]:
    """{REWARD_BASELINES: [S] float32} when every sample carries a baseline (and there is one), else {}."""
    values = [s.reward_baseline for s in samples]
    if not values or any(v is None for v in values):
        return {}
    return {REWARD_BASELINES: torch.tensor([float(v) for v in values if v is not None], dtype=torch.float32)}
