"""Every advantage estimator against a hand-written reference (plain Python loops) to 1e-6, edge cases included:
all-equal rewards, an empty response, fully masked tokens."""

from __future__ import annotations

import math

import pytest
import torch

from rlfleet.config import TrainerConfig
from rlfleet.protocols import TrainBatch
from rlfleet.services.trainer.advantages import (
    RETURNS,
    Gae,
    distill,
    drgrpo,
    gae_advantages,
    grpo,
    masked_whiten,
    reinforce_pp,
    reinforce_pp_baseline,
    sft,
)
from rlfleet.services.trainer.algorithms import PRESETS, resolve
from tests.support.train_batches import train_batch

# rows: group 0 = rows 0-2, group 1 = rows 3-4 (all-equal rewards), group 2 = row 5 (empty response)
REWARDS = [1.0, 0.0, 3.0, 2.0, 2.0, 5.0]
GROUPS = [0, 0, 0, 1, 1, 2]
MASK = [[1, 1, 0], [1, 1, 1], [1, 0, 1], [1, 1, 0], [0, 0, 0], [0, 0, 0]]


def _batch(rewards: list[float] = REWARDS, groups: list[int] = GROUPS, mask: list[list[int]] = MASK,
           **extra: torch.Tensor) -> TrainBatch:
    return train_batch(mask, rewards=rewards, groups=groups, **extra)


def _ref_group(rewards: list[float], groups: list[int], scale: bool) -> list[float]:
    out = []
    for r, g in zip(rewards, groups, strict=True):
        members = [x for x, h in zip(rewards, groups, strict=True) if h == g]
        mean = sum(members) / len(members)
        if not scale:
            out.append(r - mean)
            continue
        std = math.sqrt(sum((x - mean) ** 2 for x in members) / max(len(members) - 1, 1))
        out.append((r - mean) / (std + 1e-6))
    return out


def _ref_whiten(per_token: list[list[float]], mask: list[list[int]]) -> list[list[float]]:
    vals = [v for row, m in zip(per_token, mask, strict=True) for v, k in zip(row, m, strict=True) if k]
    if not vals:
        return [[0.0] * len(row) for row in per_token]
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
    return [[(v - mean) / (std + 1e-8) if k else 0.0 for v, k in zip(row, m, strict=True)]
            for row, m in zip(per_token, mask, strict=True)]


def _spread(per_sample: list[float], mask: list[list[int]]) -> list[list[float]]:
    return [[a if k else 0.0 for k in m] for a, m in zip(per_sample, mask, strict=True)]


def _close(got: torch.Tensor, expected: list[list[float]]) -> None:
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float32), atol=1e-6, rtol=0)


def test_grpo_and_drgrpo() -> None:
    _close(grpo(_batch()), _spread(_ref_group(REWARDS, GROUPS, True), MASK))
    _close(drgrpo(_batch()), _spread(_ref_group(REWARDS, GROUPS, False), MASK))
    assert drgrpo(_batch())[3:].abs().max() == 0          # all-equal rewards and the empty response: 0


def test_reinforce_pp_with_and_without_baseline() -> None:
    _close(reinforce_pp(_batch()), _ref_whiten(_spread(REWARDS, MASK), MASK))
    _close(reinforce_pp_baseline(_batch()), _ref_whiten(_spread(_ref_group(REWARDS, GROUPS, False), MASK), MASK))


@pytest.mark.parametrize("fn", [grpo, drgrpo, reinforce_pp, reinforce_pp_baseline])
def test_all_equal_rewards_and_fully_masked_give_zero(fn) -> None:
    assert torch.equal(fn(_batch(rewards=[2.0] * 6)), torch.zeros(6, 3))
    assert torch.equal(fn(_batch(mask=[[0, 0, 0]] * 6)), torch.zeros(6, 3))
    empty = fn(_batch(mask=[[]] * 6))
    assert empty.shape == (6, 0)


def test_whitening_uses_the_global_sum_when_given() -> None:
    calls = []

    def doubled(values):                      # stands in for 2 ranks holding the same data
        calls.append(list(values))
        return [2 * v for v in values]

    x, m = torch.tensor([[1.0, 2.0], [4.0, 0.0]]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    torch.testing.assert_close(masked_whiten(x, m, doubled), masked_whiten(x, m))   # same mean and std
    assert len(calls) == 2


def _ref_gae(reward: float, values: list[float], mask: list[int], gamma: float, lam: float
             ) -> tuple[list[float], list[float]]:
    """GAE over the valid tokens only (verl): a masked token inside the response is skipped -- the step after a
    valid token i is the next *valid* token."""
    steps = [i for i in range(len(mask)) if mask[i]]
    adv = [0.0] * len(mask)
    running = 0.0
    for k in range(len(steps) - 1, -1, -1):
        i = steps[k]
        next_v = values[steps[k + 1]] if k + 1 < len(steps) else 0.0
        r = reward if k == len(steps) - 1 else 0.0
        running = r + gamma * next_v - values[i] + gamma * lam * running
        adv[i] = running
    return ([a if k else 0.0 for a, k in zip(adv, mask, strict=True)],
            [a + v if k else 0.0 for a, v, k in zip(adv, values, mask, strict=True)])


def test_gae_hand_values_and_returns() -> None:
    values = [[0.5, 0.2, 0.1], [0.3, -0.2, 0.7], [0.1, 0.1, 0.1]]
    mask = [[1, 1, 1], [1, 0, 1], [0, 0, 0]]        # a masked token inside a response; an empty response
    rewards = [1.0, -1.0, 3.0]
    adv, ret = gae_advantages(torch.tensor(rewards), torch.tensor(values), torch.tensor(mask, dtype=torch.float32),
                              0.9, 0.8)
    refs = [_ref_gae(r, v, m, 0.9, 0.8) for r, v, m in zip(rewards, values, mask, strict=True)]
    _close(adv, [a for a, _ in refs])
    _close(ret, [r for _, r in refs])
    a, _ = _ref_gae(1.0, [0.5, 0.2, 0.1], [1, 1, 1], 1.0, 0.9)
    assert a == pytest.approx([0.339, 0.71, 0.9], abs=1e-9)        # worked by hand

    batch = _batch(rewards=rewards, groups=[0, 1, 2], mask=mask, values=torch.tensor(values))
    out = Gae(0.9, 0.8)(batch)
    _close(out, _ref_whiten([a for a, _ in refs], mask))
    _close(batch.extras[RETURNS], [r for _, r in refs])
    with pytest.raises(ValueError, match="critic"):
        Gae()(_batch())


def test_distill_and_sft() -> None:
    old = torch.tensor([[-1.0, -2.0, -3.0]] * 6)
    teacher = torch.tensor([[-0.5, -2.5, -9.0]] * 6)
    b = _batch(old_logprobs=old, teacher_logprobs=teacher)
    _close(distill(b), [[(t - o) if k else 0.0 for t, o, k in zip([-0.5, -2.5, -9.0], [-1.0, -2.0, -3.0], m,
                                                                 strict=True)] for m in MASK])
    with pytest.raises(ValueError, match="teacher"):
        distill(_batch())
    _close(sft(_batch()), [[float(k) for k in m] for m in MASK])


def test_every_preset_resolves() -> None:
    for name in PRESETS:
        adv, loss = resolve(TrainerConfig(algorithm=name))
        assert callable(adv) and callable(loss)
    assert set(PRESETS) >= {"grpo", "drgrpo", "gspo", "ppo", "reinforce_pp", "reinforce_pp_baseline", "dapo",
                            "distill", "sft"}
