"""Algorithm presets: trainer.algorithm names an (advantage, loss) pair; trainer.advantage / trainer.loss override.
The presets' records (and what each advantage reads: critic, teacher, rewards only) live in the SDK,
rlfleet/config/algorithms.py, so `rlfleet check` and the config's own checks read the same table; this module
resolves those names to the implementations: ADVANTAGE_FACTORIES and losses.LOSSES, both name -> factory(config).

| preset                | advantage              | loss        | needs                                          |
|-----------------------|------------------------|-------------|------------------------------------------------|
| grpo                  | grpo                   | clipped_pg  | trainer.estimator.scale_rewards: group/batch/none |
| rloo                  | rloo (leave-one-out)   | clipped_pg  |                                                |
| drgrpo                | drgrpo (no std)        | drgrpo      | constant-normalised token sum                  |
| gspo                  | grpo                   | gspo        | sequence-level ratio, trainer.gspo.clip        |
| ppo                   | gae                    | clipped_pg  | the critic (trainer.critic)                    |
| reinforce_pp          | reinforce_pp           | clipped_pg  | trainer.estimator.gamma (discount)             |
| reinforce_pp_baseline | reinforce_pp_baseline  | clipped_pg  |                                                |
| dapo                  | grpo                   | dapo        | buffer.filters: [dynamic_sampling]             |
| distill               | distill (reverse KL)   | clipped_pg  | trainer.teacher.model_path                     |
| sft                   | sft                    | sft         |                                                |
| cispo                 | grpo                   | cispo       | trainer.clip_low / clip_high (loss_variants.py) |
| gpg                   | gpg                    | gpg         | (advantages_baselines.py)                      |
| clip_cov              | grpo                   | clip_cov    | trainer.clip_cov                               |
| kl_cov                | grpo                   | kl_cov      | trainer.kl_cov                                 |
| opo                   | opo (length-weighted)  | clipped_pg  |                                                |
| remax                 | remax (greedy baseline)| clipped_pg  | a rollout_fn that supplies greedy baselines    |

ReMax's baseline is the reward of one greedy response per group, generated and scored by the rollout (not trained
on) and carried by each sample (Sample.reward_baseline; advantages_baselines.py).
trainer.masking wraps the loss in TRL's entropy / off-policy masks (loss_masks.py); trainer.convention sets the verl
or TRL conventions of the KL and entropy terms and the estimators (docs/algorithms.md).

DAPO over-samples through the buffer: buffer.over_sample issues up to ceil(over_sample * groups_per_step) groups
per step up front, a group the dynamic_sampling filter drops frees its place for a replacement ticket, and once the
step's batch is full the groups still in flight that no step can use are cancelled (their engine requests aborted),
so every step gets groups_per_step informative groups without waiting on replacements one at a time.
trainer.kl.coef > 0 wraps the loss in a KL penalty against the reference model (k1 / k2 / k3 / abs, "+" variants,
optionally ratio-weighted; a token mean or aggregated like the policy loss: trainer.kl.agg), or with kl.in_reward
puts -coef * KL(old || ref) into the per-token rewards the estimator reads. Every loss is wrapped in an
EntropyTerm: the policy's entropy is a metric every step, and trainer.policy_loss.entropy_coef > 0 adds the entropy
bonus (trainer.policy_loss.entropy_agg).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlfleet.config import ALGORITHM_PRESETS as PRESETS
from rlfleet.config import TrainerConfig, needs_critic, needs_teacher, reads_only_rewards
from rlfleet.plugins import PluginError, load_callable
from rlfleet.protocols import AdvantageEstimator, LossFn, TrainBatch, ZeroAtZeroAdvantage
from rlfleet.services.trainer.advantages import (
    ADVANTAGES,
    TOKEN_REWARDS,
    Gae,
    Grpo,
    ReinforcePP,
    ReinforcePPBaseline,
)
from rlfleet.services.trainer.advantages_baselines import ESTIMATOR_FACTORIES
from rlfleet.services.trainer.loss_masks import masked_loss
from rlfleet.services.trainer.loss_variants import VARIANT_LOSSES
from rlfleet.services.trainer.losses import LOSSES, entropy_term, kl_estimate, kl_penalized

# every built-in loss: losses.LOSSES and verl's other policy losses (loss_variants.py)
LOSS_FACTORIES: dict[str, Callable[[TrainerConfig], LossFn]] = {**LOSSES, **VARIANT_LOSSES}


def _fixed(estimator: AdvantageEstimator) -> Callable[[TrainerConfig], AdvantageEstimator]:
    return lambda cfg: estimator


# built-in advantage name (rlfleet.config.ADVANTAGE_SPECS) -> factory taking the trainer config: the same shape as
# losses.LOSSES; estimators without knobs are advantages.ADVANTAGES' instances, the others read their sub-sections
ADVANTAGE_FACTORIES: dict[str, Callable[[TrainerConfig], AdvantageEstimator]] = {
    **{name: _fixed(estimator) for name, estimator in ADVANTAGES.items()},
    "gae": lambda cfg: Gae(cfg.critic.gamma, cfg.critic.lam, cfg.estimator.whiten_std),
    "grpo": lambda cfg: Grpo(cfg.estimator.scale_rewards, cfg.estimator.std_eps, cfg.estimator.single_sample),
    "reinforce_pp": lambda cfg: ReinforcePP(cfg.estimator.gamma, cfg.estimator.whiten_std),
    "reinforce_pp_baseline": lambda cfg: ReinforcePPBaseline(cfg.estimator.whiten_std),
    **ESTIMATOR_FACTORIES,
}


@dataclass(frozen=True)
class KlInReward:
    """verl's use_kl_in_reward: batch.extras["token_rewards"] -= coef * KL(old || ref) per valid token (no
    gradient), then the inner estimator (which reads the per-token rewards) runs."""

    inner: AdvantageEstimator
    coef: float
    estimator: str = "k3"

    def __call__(self, batch: TrainBatch) -> torch.Tensor:
        if batch.ref_logprobs is None or batch.old_logprobs is None:
            raise ValueError("trainer.kl.in_reward needs reference and old logprobs (trainer.kl.coef > 0)")
        with torch.no_grad():
            kl = kl_estimate(batch.old_logprobs, batch.ref_logprobs, self.estimator.rstrip("+"))     # [S, T]
        batch.extras[TOKEN_REWARDS] = -self.coef * kl * batch.response_mask.to(torch.float32)
        return self.inner(batch)


def resolve_advantage(name: str, cfg: TrainerConfig | None = None) -> AdvantageEstimator:
    if name in ADVANTAGE_FACTORIES:
        return ADVANTAGE_FACTORIES[name](cfg or TrainerConfig())
    if ":" in name:
        return load_callable(name, "trainer.advantage", AdvantageEstimator)
    raise PluginError(f"advantage '{name}': not a built-in ({', '.join(sorted(ADVANTAGE_FACTORIES))}) "
                      "nor a dotted path 'package.module:attribute'")


def resolve_loss(name: str, cfg: TrainerConfig) -> LossFn:
    if name in LOSS_FACTORIES:
        return LOSS_FACTORIES[name](cfg)
    if ":" in name:
        return load_callable(name, "trainer.loss", LossFn)
    raise PluginError(f"loss '{name}': not a built-in ({', '.join(sorted(LOSS_FACTORIES))}) "
                      "nor a dotted path 'package.module:attribute'")


def resolve(cfg: TrainerConfig) -> tuple[AdvantageEstimator, LossFn]:
    """The advantage estimator and loss for this trainer config; raises PluginError naming the bad field."""
    if cfg.algorithm not in PRESETS:
        raise PluginError(f"trainer.algorithm '{cfg.algorithm}': unknown preset (known: {', '.join(sorted(PRESETS))})")
    preset = PRESETS[cfg.algorithm]
    advantage = resolve_advantage(cfg.advantage or preset.advantage, cfg)
    loss_name = cfg.loss or preset.loss
    loss = masked_loss(resolve_loss(loss_name, cfg), cfg.masking)
    if cfg.kl.coef > 0 and cfg.kl.in_reward:
        advantage = KlInReward(advantage, cfg.kl.coef, cfg.kl.estimator)
    elif cfg.kl.coef > 0:
        loss = kl_penalized(loss, cfg, loss_name)
    return advantage, entropy_term(loss, cfg, loss_name)


def skips_zero_advantage(cfg: TrainerConfig, loss: LossFn) -> bool:
    """Whether a single-pass step may leave rows with a zero advantage at every token out of its forward: the
    advantage is a reward-only built-in (rlfleet/config/algorithms.py), no KL anywhere, and the loss declares
    `zero_at_zero_advantage` (rlfleet.protocols.ZeroAtZeroAdvantage: a token with advantage 0 adds 0 to it and its
    gradient). rlfleet/services/trainer/step.py does the rest."""
    return reads_only_rewards(cfg) and cfg.kl.coef == 0 and \
        isinstance(loss, ZeroAtZeroAdvantage) and loss.zero_at_zero_advantage


__all__ = ["ADVANTAGE_FACTORIES", "LOSS_FACTORIES", "PRESETS", "KlInReward", "needs_critic", "needs_teacher", "resolve",
           "resolve_advantage", "resolve_loss", "skips_zero_advantage"]
