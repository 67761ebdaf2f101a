"""Issue 13's advantage estimators against hand-written references: RLOO, GRPO's std per group / per batch / off
(TRL scale_rewards), the raw reward of a one-sample group, REINFORCE++ with a discount, and GAE that skips the
masked tool tokens inside a multi-turn response (verl: value and running advantage carried through them)."""

from __future__ import annotations

import math

import pytest
import torch

from rlfleet.config import TrainerConfig
from rlfleet.protocols import TrainBatch
from rlfleet.sample import Sample
from rlfleet.services.trainer.advantages import ALL_REDUCE_SUM, RETURNS, Gae, Grpo, ReinforcePP, gae_advantages, rloo
from rlfleet.services.trainer.algorithms import resolve
from rlfleet.services.trainer.batch import build_train_batch
from tests.support.train_batches import train_batch

# group 0: 1, 0, 0, 1; group 1: all equal; group 2: one sample; group 3: 3, 1 and an empty response (reward 2)
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 7.0, 3.0, 1.0, 2.0]
GROUPS = [0, 0, 0, 0, 1, 1, 1, 2, 3, 3, 3]
EMPTY = 10


def _batch(rewards=REWARDS, groups=GROUPS, mask=None, **extra) -> TrainBatch:
    m = torch.ones(len(rewards), 2) if mask is None else torch.tensor(mask, dtype=torch.float32)
    if mask is None:
        m[EMPTY] = 0.0
    return train_batch(m, rewards=rewards, groups=groups, **extra)


def _members(i: int) -> list[int]:
    return [k for k in range(len(REWARDS)) if GROUPS[k] == GROUPS[i]]


def _check(adv: torch.Tensor, per_sample: list[float]) -> None:
    for i, a in enumerate(per_sample):
        expected = [0.0, 0.0] if i == EMPTY else [a, a]
        assert adv[i].tolist() == pytest.approx(expected, abs=1e-6), i


def test_rloo_leave_one_out_baseline() -> None:
    ref = []
    for i in range(len(REWARDS)):
        others = [REWARDS[k] for k in _members(i) if k != i]
        ref.append(REWARDS[i] - sum(others) / len(others) if others else REWARDS[i])   # one sample: raw reward
    _check(rloo(_batch()), ref)
    assert ref[4] == ref[5] == ref[6] == 0.0 and ref[7] == 7.0
    adv, _ = resolve(TrainerConfig(algorithm="rloo"))
    assert adv is rloo


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_grpo_std_per_group_per_batch_or_off(scale: str) -> None:
    n = len(REWARDS)
    mean_all = sum(REWARDS) / n
    batch_std = math.sqrt(sum((r - mean_all) ** 2 for r in REWARDS) / (n - 1))
    ref = []
    for i in range(n):
        g = [REWARDS[k] for k in _members(i)]
        if len(g) == 1:
            ref.append(REWARDS[i])
            continue
        mean = sum(g) / len(g)
        std = {"group": math.sqrt(sum((x - mean) ** 2 for x in g) / (len(g) - 1)), "batch": batch_std,
               "none": None}[scale]
        ref.append((REWARDS[i] - mean) / (std + 1e-6) if std is not None else REWARDS[i] - mean)
    _check(Grpo(scale)(_batch()), ref)
    adv, _ = resolve(TrainerConfig(estimator={"scale_rewards": scale}))
    _check(adv(_batch()), ref)


def test_grpo_batch_std_is_the_global_batchs() -> None:
    """Two ranks: this rank's rewards plus another rank's [10, 0] (group 4), summed through all_reduce_sum."""
    other = [10.0, 0.0]

    def reduce_sum(values: list[float]) -> list[float]:          # what the other rank contributes to each sum
        if len(values) == 2:
            return [values[0] + 2, values[1] + sum(other)]
        mean = (sum(REWARDS) + sum(other)) / (len(REWARDS) + 2)
        return [values[0] + sum((x - mean) ** 2 for x in other)]

    allr = REWARDS + other
    mean = sum(allr) / len(allr)
    std = math.sqrt(sum((x - mean) ** 2 for x in allr) / (len(allr) - 1))
    adv = Grpo("batch")(_batch(extras={ALL_REDUCE_SUM: reduce_sum}))
    assert adv[0, 0].item() == pytest.approx((1.0 - 0.5) / (std + 1e-6), abs=1e-6)


def _returns(rewards_at: dict[int, float], mask: list[int], gamma: float) -> list[float]:
    """Discounted return over the valid tokens only: a masked token is not a step."""
    steps = [t for t, k in enumerate(mask) if k]
    out = [0.0] * len(mask)
    running = 0.0
    for t in reversed(steps):
        running = rewards_at.get(t, 0.0) + gamma * running
        out[t] = running
    return out


def test_reinforce_pp_discount_skips_a_tool_turn() -> None:
    mask = [[1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]]
    rewards = [1.0, -1.0, 5.0]
    b = _batch(rewards=rewards, groups=[0, 0, 1], mask=mask)
    adv = ReinforcePP(0.9)(b)
    per = [_returns({max(t for t, k in enumerate(m) if k): r} if any(m) else {}, m, 0.9)
           for r, m in zip(rewards, mask, strict=True)]
    vals = [per[i][t] for i in range(3) for t in range(6) if mask[i][t]]
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
    for i in range(3):
        for t in range(6):
            expected = (per[i][t] - mean) / (std + 1e-8) if mask[i][t] else 0.0
            assert adv[i, t].item() == pytest.approx(expected, abs=1e-6), (i, t)
    assert per[0][:2] == pytest.approx([0.81, 0.9])                 # two valid steps before the reward, not four
    adv_fn, _ = resolve(TrainerConfig(algorithm="reinforce_pp", estimator={"gamma": 0.9}))
    assert adv_fn == ReinforcePP(0.9)


def _tool_turn_sample(values_in_tool: float) -> tuple[Sample, list[float]]:
    """A two-turn response: 1 policy token, 2 tool-output tokens (loss mask 0), 1 policy token; reward 1."""
    s = Sample(group_id="g", index=0, group_size=1, prompt_ids=[1, 2, 3], response_ids=[4, 5, 6, 7],
               rollout_logprobs=[-1.0, 0.0, 0.0, -1.0], loss_mask=[1, 0, 0, 1], reward=1.0)
    return s, [0.0, values_in_tool, -values_in_tool, 0.0]


@pytest.mark.parametrize("tool_value", [0.0, 0.7])
def test_gae_carries_value_and_advantage_through_a_tool_turn(tool_value: float) -> None:
    sample, values = _tool_turn_sample(tool_value)
    batch = build_train_batch([sample])
    assert batch.response_mask.tolist() == [[1.0, 0.0, 0.0, 1.0]]
    adv, ret = gae_advantages(batch.rewards, torch.tensor([values]), batch.response_mask, 1.0, 0.95)
    # verl: t=3: delta = 1 - 0 -> 1; tool tokens carried; t=0: delta = 0 + V(t=3) - V(t=0) = 0 -> 0 + 0.95 * 1
    assert adv[0].tolist() == pytest.approx([0.95, 0.0, 0.0, 1.0], abs=1e-7)      # not 0.95^3 = 0.857
    assert ret[0].tolist() == pytest.approx([0.95, 0.0, 0.0, 1.0], abs=1e-7)      # and not moved by tool values
    # with values on the policy tokens: t=3: 1 - 0.4; t=0: 0 + 1 * 0.4 - 0.2 + 0.95 * 0.6
    adv, ret = gae_advantages(batch.rewards, torch.tensor([[0.2, tool_value, 3.0, 0.4]]), batch.response_mask,
                              1.0, 0.95)
    assert adv[0].tolist() == pytest.approx([0.4 - 0.2 + 0.95 * 0.6, 0.0, 0.0, 0.6], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([0.4 - 0.2 + 0.95 * 0.6 + 0.2, 0.0, 0.0, 1.0], abs=1e-6)
    b = build_train_batch([sample, Sample(group_id="g", index=1, group_size=1, prompt_ids=[1], response_ids=[4],
                                          rollout_logprobs=[-1.0], reward=0.0)])
    b.values = torch.zeros(2, 4)
    Gae(1.0, 0.95)(b)
    assert b.extras[RETURNS][0].tolist() == pytest.approx([0.95, 0.0, 0.0, 1.0], abs=1e-7)
