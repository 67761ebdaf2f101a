"""verl's OPO, GPG and ReMax estimators against their formulas written out here in plain Python (verl core_algos
compute_{opo,gpg,remax}_outcome_advantage); the samples' greedy baselines laid out in the batch for ReMax, and ReMax
refused by `rlfleet check` with a rollout function that does not supply them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from rlfleet.config import Config, ConfigError, check_trainer, parse_config
from rlfleet.local.preflight import check_reward_baselines
from rlfleet.plugins import PluginError
from rlfleet.sample import Sample
from rlfleet.services.rollout.labelled import labelled
from rlfleet.services.rollout.rollout_fns import single_turn
from rlfleet.services.trainer.advantages import TOKEN_REWARDS
from rlfleet.services.trainer.algorithms import resolve_advantage
from rlfleet.services.trainer.batch import build_train_batch
from rlfleet.services.trainer.reward_baselines import REWARD_BASELINES
from tests.support.train_batches import train_batch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "addition" / "config.yaml"
REWARDS = [1.0, 0.0, 0.5, 2.0, 0.0, 3.0]
GROUPS = [0, 0, 0, 1, 1, 2]                 # group 2: one sample
MASK = [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]


def _per_sample(adv: torch.Tensor) -> list[float]:
    for i, row in enumerate(MASK):          # broadcast over the valid tokens, zero elsewhere
        assert all(float(adv[i, j]) == (float(adv[i, 0]) if k else 0.0) for j, k in enumerate(row))
    return [float(adv[i, 0]) for i in range(len(MASK))]


def test_opo_length_weighted_baseline() -> None:
    adv = resolve_advantage("opo")(train_batch(MASK, rewards=REWARDS, groups=GROUPS))
    want = []
    for i, g in enumerate(GROUPS):
        members = [k for k in range(len(GROUPS)) if GROUPS[k] == g]
        lengths = [sum(MASK[k]) for k in members]
        baseline = 0.0 if len(members) == 1 else \
            sum(n * REWARDS[k] for n, k in zip(lengths, members, strict=True)) / sum(lengths)
        want.append(REWARDS[i] - baseline)
    assert _per_sample(adv) == pytest.approx(want, abs=1e-6)


def test_gpg_scales_by_the_share_of_nonzero_scores() -> None:
    adv = resolve_advantage("gpg")(train_batch(MASK, rewards=REWARDS, groups=GROUPS))
    alpha = len(REWARDS) / sum(r != 0 for r in REWARDS)                     # 6 / 4
    want = []
    for i, g in enumerate(GROUPS):
        members = [REWARDS[k] for k in range(len(GROUPS)) if GROUPS[k] == g]
        mean = 0.0 if len(members) == 1 else sum(members) / len(members)
        want.append(alpha * (REWARDS[i] - mean))
    assert _per_sample(adv) == pytest.approx(want, abs=1e-6)


def test_remax_return_minus_the_greedy_reward() -> None:
    baselines = [0.5, 0.5, 0.5, 1.0, 1.0, 2.0]
    adv = resolve_advantage("remax")(train_batch(MASK, rewards=REWARDS, groups=GROUPS,
                                                 extras={REWARD_BASELINES: torch.tensor(baselines)}))
    for i, row in enumerate(MASK):          # the outcome reward sits on the last token: every earlier return equals it
        for j, k in enumerate(row):
            assert float(adv[i, j]) == pytest.approx((REWARDS[i] - baselines[i]) if k else 0.0, abs=1e-6)
    with pytest.raises(ValueError, match="reward_baselines"):
        resolve_advantage("remax")(train_batch(MASK, rewards=REWARDS, groups=GROUPS))


def test_remax_with_per_token_rewards_is_the_return_to_go_minus_the_baseline() -> None:
    """With per-token rewards (the KL-in-reward penalty) each token's advantage is the sum of the rewards from it
    to the end (the outcome reward on the last valid token) minus the greedy baseline; 0 on padding."""
    baselines = [0.5, 0.5, 0.5, 1.0, 1.0, 2.0]
    per_token = [[0.1 * (i + 1) + 0.01 * j for j in range(4)] for i in range(len(MASK))]
    adv = resolve_advantage("remax")(train_batch(MASK, rewards=REWARDS, groups=GROUPS, extras={
        REWARD_BASELINES: torch.tensor(baselines), TOKEN_REWARDS: torch.tensor(per_token)}))
    for i, row in enumerate(MASK):
        last = max(j for j, k in enumerate(row) if k)
        for j, k in enumerate(row):
            rest = sum(per_token[i][t] for t in range(j, len(row)) if row[t]) + (REWARDS[i] if j <= last else 0.0)
            assert float(adv[i, j]) == pytest.approx(rest - baselines[i] if k else 0.0, abs=1e-5)


def _example(trainer: dict[str, Any]) -> Config:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["trainer"].update(trainer)
    return parse_config(data)


def test_remax_reads_the_samples_greedy_baselines_through_the_batch() -> None:
    """Sample.reward_baseline -> build_train_batch -> extras[REWARD_BASELINES] -> the remax advantages, per row."""
    rewards, baselines = [1.0, 0.0, 1.0], [0.25, 0.25, 1.0]
    samples = [Sample(group_id=f"g{i // 2}", index=i % 2, group_size=2, prompt_ids=[3, 4], response_ids=[5, 6],
                      rollout_logprobs=[-0.5, -0.5], reward=r, reward_baseline=b)
               for i, (r, b) in enumerate(zip(rewards, baselines, strict=True))]
    adv = resolve_advantage("remax")(build_train_batch(samples))                           # [3, 2]
    assert adv.flatten().tolist() == pytest.approx([r - b for r, b in zip(rewards, baselines, strict=True)
                                                    for _ in range(2)])
    samples[1].reward_baseline = None                       # one sample without a baseline: no key, refused
    assert REWARD_BASELINES not in build_train_batch(samples).extras
    with pytest.raises(ValueError, match="carries no reward_baseline"):
        resolve_advantage("remax")(build_train_batch(samples))


def _agent(ctx: Any, prompt: Any, ticket: Any) -> Any:
    """A rollout function that declares nothing (an agent's, say)."""
    return iter(())


def test_remax_needs_a_rollout_function_that_supplies_baselines() -> None:
    cfg = _example({"advantage": "remax"})
    check_trainer(cfg)                                      # the trainer itself has all it needs
    check_reward_baselines(cfg, single_turn)
    for fn in (labelled, _agent):
        with pytest.raises(PluginError, match="trainer advantage remax needs a greedy .* does not supply one"):
            check_reward_baselines(cfg, fn)
    check_reward_baselines(_example({"algorithm": "grpo"}), labelled)       # no baseline needed: nothing to refuse


def test_a_multi_rank_entropy_quantile_is_refused_at_check_time() -> None:
    with pytest.raises(ConfigError, match="one data-parallel rank only"):
        check_trainer(_example({"world_size": 2, "masking": {"top_entropy_quantile": 0.2}}))
    check_trainer(_example({"masking": {"top_entropy_quantile": 0.2}}))
    check_trainer(_example({"algorithm": "opo"}))
