"""GRPO advantages against hand-computed values."""

from __future__ import annotations

import torch

from rlfleet.protocols import TrainBatch
from rlfleet.services.trainer.advantages import GRPO_EPS, group_normalized_rewards, grpo
from tests.support.train_batches import train_batch


def _batch(rewards: list[float], groups: list[int], mask: list[list[float]]) -> TrainBatch:
    return train_batch(mask, rewards=rewards, groups=groups)


def test_group_normalisation_hand_values() -> None:
    # group 0: rewards 1, 2, 3 -> mean 2, unbiased std 1; group 1: 5, 5 -> all equal; group 2: one sample, no
    # baseline -> its raw reward (verl)
    adv = group_normalized_rewards(torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 7.0]), torch.tensor([0, 0, 0, 1, 1, 2]))
    expected = torch.tensor([-1 / (1 + GRPO_EPS), 0.0, 1 / (1 + GRPO_EPS), 0.0, 0.0, 7.0])
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)


def test_two_sample_group() -> None:
    # rewards 0, 1: mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / (0.70710678 + eps)
    adv = group_normalized_rewards(torch.tensor([0.0, 1.0]), torch.tensor([0, 0]))
    v = 0.5 / (0.5 ** 0.5 + GRPO_EPS)
    torch.testing.assert_close(adv, torch.tensor([-v, v]), atol=1e-6, rtol=0)


def test_grpo_broadcasts_over_tokens_and_zeroes_masked() -> None:
    batch = _batch([1.0, 3.0, 4.0, 4.0], [0, 0, 1, 1],
                   [[1, 1, 0], [1, 0, 1], [1, 1, 1], [0, 0, 0]])
    adv = grpo(batch)                                   # [4, 3]
    a = 1.0 / (2 ** 0.5 + GRPO_EPS)                     # rewards 1, 3: centred +-1, std sqrt(2)
    expected = torch.tensor([[-a, -a, 0], [a, 0, a], [0, 0, 0], [0, 0, 0]])
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)


def test_all_equal_rewards_give_exact_zero() -> None:
    batch = _batch([0.3] * 4, [0, 0, 0, 0], [[1, 1]] * 4)
    assert torch.equal(grpo(batch), torch.zeros(4, 2))


def test_empty_responses_and_empty_batch() -> None:
    batch = _batch([1.0, 0.0], [0, 0], [[], []])        # T = 0
    assert grpo(batch).shape == (2, 0)
    empty = _batch([], [], [])
    assert grpo(empty).shape == (0, 0)
