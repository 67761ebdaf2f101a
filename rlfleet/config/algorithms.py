"""The name-level facts of the trainer's algorithms: each preset (trainer.algorithm) as one record naming its
advantage estimator and loss, and each built-in advantage estimator as one record saying what it reads.

Everything that asks "does this config need a critic / a teacher / groups of two or more, or read only rewards?"
reads these records: the config's cross-section check (rlfleet/config/root.py), the trainer's start-up checks
(rlfleet/config/trainer_checks.py), and the trainer's registry (rlfleet/services/trainer/algorithms.py), which keys
its implementations by the same names (tests/unit/test_algorithm_records.py fails when the two disagree). The SDK
holds the facts because it may not import the trainer service; adding a preset is adding one entry to ALGORITHM_PRESETS.
Public through the package door: `from rlfleet.config import ALGORITHM_PRESETS, needs_critic`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from rlfleet.config.trainer import TrainerConfig


@dataclass(frozen=True)
class AdvantageSpec:
    """What a built-in advantage estimator (trainer.advantage, or a preset's) reads besides the batch's rewards."""

    name: str
    needs_critic: bool = False     # reads batch.values: the trainer loads the critic (trainer.critic)
    needs_teacher: bool = False    # reads batch.teacher_logprobs: the trainer loads trainer.teacher.model_path
    # reads only rewards (never old / reference / teacher logprobs or critic values): its advantages exist before
    # the training forward, so zero-advantage rows can be left out of it (perf.skip_zero_advantage)
    reward_only: bool = False
    # reads batch.extras['reward_baselines'] (ReMax): the rollout function must declare it supplies a greedy baseline
    # reward per group (rlfleet.protocols.SuppliesRewardBaselines; `rlfleet check` refuses one that does not), and
    # the rollout then generates and scores one greedy response per group (not trained on)
    needs_reward_baseline: bool = False
    # what the rollout does not deliver yet, so `rlfleet check` refuses this estimator ("" when nothing)
    missing: str = ""


@dataclass(frozen=True)
class AlgorithmPreset:
    """One trainer.algorithm: the advantage and loss it names (trainer.advantage / trainer.loss override them)."""

    name: str
    advantage: str                 # a key of ADVANTAGE_SPECS
    loss: str                      # a key of LOSS_NAMES
    needs_groups: bool = False     # a group baseline: rollout.group_size must be >= 2


ADVANTAGE_SPECS: Mapping[str, AdvantageSpec] = MappingProxyType({spec.name: spec for spec in (
    AdvantageSpec("grpo", reward_only=True),
    AdvantageSpec("drgrpo", reward_only=True),
    AdvantageSpec("rloo", reward_only=True),
    AdvantageSpec("reinforce_pp", reward_only=True),
    AdvantageSpec("reinforce_pp_baseline", reward_only=True),
    AdvantageSpec("gae", needs_critic=True),
    AdvantageSpec("distill", needs_teacher=True),
    AdvantageSpec("sft"),
    AdvantageSpec("opo", reward_only=True),
    AdvantageSpec("gpg", reward_only=True),
    AdvantageSpec("remax", reward_only=True, needs_reward_baseline=True),
)})

# the built-in losses (trainer.loss, or a preset's): rlfleet/services/trainer/losses.py LOSSES implements each
LOSS_NAMES: frozenset[str] = frozenset({"clipped_pg", "dapo", "drgrpo", "gspo", "sft",
                                        "cispo", "gpg", "clip_cov", "kl_cov"})

ALGORITHM_PRESETS: Mapping[str, AlgorithmPreset] = MappingProxyType({preset.name: preset for preset in (
    AlgorithmPreset("grpo", "grpo", "clipped_pg", needs_groups=True),
    AlgorithmPreset("rloo", "rloo", "clipped_pg", needs_groups=True),
    AlgorithmPreset("drgrpo", "drgrpo", "drgrpo", needs_groups=True),
    AlgorithmPreset("gspo", "grpo", "gspo", needs_groups=True),
    AlgorithmPreset("ppo", "gae", "clipped_pg"),
    AlgorithmPreset("reinforce_pp", "reinforce_pp", "clipped_pg"),
    AlgorithmPreset("reinforce_pp_baseline", "reinforce_pp_baseline", "clipped_pg", needs_groups=True),
    AlgorithmPreset("dapo", "grpo", "dapo", needs_groups=True),
    AlgorithmPreset("distill", "distill", "clipped_pg"),
    AlgorithmPreset("sft", "sft", "sft"),
    # verl's other policy losses (GPG with its own estimator, the others on GRPO's advantages, as verl's examples),
    # and OPO's estimator with the clipped loss
    AlgorithmPreset("cispo", "grpo", "cispo", needs_groups=True),
    AlgorithmPreset("gpg", "gpg", "gpg", needs_groups=True),
    AlgorithmPreset("clip_cov", "grpo", "clip_cov", needs_groups=True),
    AlgorithmPreset("kl_cov", "grpo", "kl_cov", needs_groups=True),
    AlgorithmPreset("opo", "opo", "clipped_pg", needs_groups=True),
    # ReMax: the baseline is a greedy response's reward, not the group's (group_size 1 works; one extra greedy
    # generation per group)
    AlgorithmPreset("remax", "remax", "clipped_pg"),
)})

_NO_SPEC = AdvantageSpec("")


def advantage_name(t: TrainerConfig) -> str:
    """The advantage this trainer section uses: trainer.advantage, else its preset's ("" for an unknown preset)."""
    preset = ALGORITHM_PRESETS.get(t.algorithm)
    return t.advantage or (preset.advantage if preset is not None else "")


def advantage_spec(t: TrainerConfig) -> AdvantageSpec:
    """The record of the advantage this section uses; a plugin's (dotted path) or an unknown name reads nothing
    beyond what the batch always has (all False)."""
    return ADVANTAGE_SPECS.get(advantage_name(t), _NO_SPEC)


def needs_critic(t: TrainerConfig) -> bool:
    return advantage_spec(t).needs_critic


def needs_teacher(t: TrainerConfig) -> bool:
    return advantage_spec(t).needs_teacher


def needs_reward_baseline(t: TrainerConfig) -> bool:
    return advantage_spec(t).needs_reward_baseline


def reads_only_rewards(t: TrainerConfig) -> bool:
    return advantage_spec(t).reward_only


def needs_groups(algorithm: str) -> bool:
    """Whether the preset trainer.algorithm computes a group baseline (rollout.group_size >= 2)."""
    preset = ALGORITHM_PRESETS.get(algorithm)
    return preset is not None and preset.needs_groups
