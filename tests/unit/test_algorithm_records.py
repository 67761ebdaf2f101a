"""The algorithm records (rlfleet/config/algorithms.py, the SDK's name-level facts) and the trainer's registry
(rlfleet/services/trainer/algorithms.py, advantages.py, losses.py) name the same algorithms, and the declared
capabilities (a loss's zero_at_zero_advantage, a hook's needs_old_logprobs) default to False when undeclared."""

from __future__ import annotations

import torch

from rlfleet.config import (
    ADVANTAGE_SPECS,
    ALGORITHM_PRESETS,
    LOSS_NAMES,
    TrainerConfig,
    needs_critic,
    needs_groups,
    needs_teacher,
    reads_only_rewards,
)
from rlfleet.protocols import LossOutput, NeedsOldLogprobs, TrainBatch, ZeroAtZeroAdvantage
from rlfleet.services.trainer.advantages import ADVANTAGES
from rlfleet.services.trainer.algorithms import (
    ADVANTAGE_FACTORIES,
    LOSS_FACTORIES,
    PRESETS,
    resolve,
    skips_zero_advantage,
)
from rlfleet.services.trainer.losses import LOSSES
from rlfleet.services.trainer.step import StepContext, uses_single_pass


def test_the_sdk_records_and_the_trainer_registry_name_the_same_algorithms() -> None:
    assert set(ADVANTAGE_SPECS) == set(ADVANTAGE_FACTORIES) >= set(ADVANTAGES)
    assert set(LOSS_NAMES) == set(LOSS_FACTORIES) >= set(LOSSES)
    assert PRESETS is ALGORITHM_PRESETS
    for name, preset in ALGORITHM_PRESETS.items():
        assert preset.name == name
        assert preset.advantage in ADVANTAGE_SPECS and preset.loss in LOSS_NAMES
    for name, spec in ADVANTAGE_SPECS.items():
        assert spec.name == name


def test_presets_are_the_documented_pairs() -> None:
    # the table of rlfleet/services/trainer/algorithms.py's module doc, written out here
    expected = {"grpo": ("grpo", "clipped_pg"), "rloo": ("rloo", "clipped_pg"), "drgrpo": ("drgrpo", "drgrpo"),
                "gspo": ("grpo", "gspo"), "ppo": ("gae", "clipped_pg"), "reinforce_pp": ("reinforce_pp", "clipped_pg"),
                "reinforce_pp_baseline": ("reinforce_pp_baseline", "clipped_pg"), "dapo": ("grpo", "dapo"),
                "distill": ("distill", "clipped_pg"), "sft": ("sft", "sft"), "cispo": ("grpo", "cispo"),
                "gpg": ("gpg", "gpg"), "clip_cov": ("grpo", "clip_cov"), "kl_cov": ("grpo", "kl_cov"),
                "opo": ("opo", "clipped_pg"), "remax": ("remax", "clipped_pg")}
    assert {n: (p.advantage, p.loss) for n, p in ALGORITHM_PRESETS.items()} == expected


def test_what_each_algorithm_needs() -> None:
    groups = {"grpo", "dapo", "gspo", "drgrpo", "reinforce_pp_baseline", "rloo", "cispo", "gpg", "clip_cov", "kl_cov",
              "opo"}
    assert {n for n in ALGORITHM_PRESETS if needs_groups(n)} == groups
    assert not needs_groups("no_such_preset")
    assert {n for n in ALGORITHM_PRESETS if needs_critic(TrainerConfig(algorithm=n))} == {"ppo"}
    assert {n for n in ALGORITHM_PRESETS if needs_teacher(TrainerConfig(algorithm=n))} == {"distill"}
    reward_only = {"grpo", "rloo", "drgrpo", "reinforce_pp", "reinforce_pp_baseline", "opo", "gpg", "remax"}
    assert {n for n, s in ADVANTAGE_SPECS.items() if s.reward_only} == reward_only
    assert {n for n, s in ADVANTAGE_SPECS.items() if s.needs_reward_baseline} == {"remax"}
    # trainer.advantage overrides the preset's; a plugin's advantage reads nothing declared
    assert needs_critic(TrainerConfig(algorithm="grpo", advantage="gae"))
    assert not needs_critic(TrainerConfig(algorithm="ppo", advantage="grpo"))
    assert needs_teacher(TrainerConfig(algorithm="sft", advantage="distill"))
    assert not reads_only_rewards(TrainerConfig(algorithm="grpo", advantage="my_pkg.adv:estimate"))
    assert reads_only_rewards(TrainerConfig(algorithm="ppo", advantage="rloo"))


def _plain_loss(logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch,
                token_count: float) -> LossOutput:
    return LossOutput(loss=logprobs.sum(), metrics={})


def test_a_loss_declares_zero_at_zero_advantage_or_is_taken_as_false() -> None:
    cfg = TrainerConfig(algorithm="grpo")
    _, loss = resolve(cfg)
    assert isinstance(loss, ZeroAtZeroAdvantage) and skips_zero_advantage(cfg, loss)
    assert not isinstance(_plain_loss, ZeroAtZeroAdvantage)
    assert not skips_zero_advantage(cfg, _plain_loss)


class _Declares:
    needs_old_logprobs = True

    def before_step(self, step: int, batch: TrainBatch) -> None:
        return None


class _DeclaresFalse:
    needs_old_logprobs = False


class _Silent:
    def before_step(self, step: int, batch: TrainBatch) -> None:
        return None


def _ctx(*hooks: object) -> StepContext:
    advantage_fn, loss_fn = resolve(TrainerConfig())
    return StepContext(advantage_fn=advantage_fn, loss_fn=loss_fn, hooks=list(hooks), temperature=1.0,
                       minibatches=1, grad_clip=1.0, world_size=1, device=torch.device("cpu"))


def test_a_hook_declares_needs_old_logprobs_or_is_taken_as_false() -> None:
    assert isinstance(_Declares(), NeedsOldLogprobs) and not isinstance(_Silent(), NeedsOldLogprobs)
    assert uses_single_pass(_ctx(_Silent(), _DeclaresFalse()))
    assert not uses_single_pass(_ctx(_Silent(), _Declares()))
