"""Algorithm presets: trainer.algorithm names an (advantage, loss) pair; trainer.advantage / trainer.loss override.

| preset                | advantage              | loss        | needs                                          |
|-----------------------|------------------------|-------------|------------------------------------------------|
| grpo                  | grpo                   | clipped_pg  |                                                |
| drgrpo                | drgrpo (no std)        | drgrpo      | constant-normalised token sum                  |
| gspo                  | grpo                   | gspo        | sequence-level ratio, trainer.gspo_clip        |
| ppo                   | gae                    | clipped_pg  | the critic (trainer.critic)                    |
| reinforce_pp          | reinforce_pp           | clipped_pg  |                                                |
| reinforce_pp_baseline | reinforce_pp_baseline  | clipped_pg  |                                                |
| dapo                  | grpo                   | dapo        | buffer.filters: [dynamic_sampling]             |
| distill               | distill (reverse KL)   | clipped_pg  | trainer.teacher.model_path                     |
| sft                   | sft                    | sft         |                                                |

DAPO over-samples through the buffer: buffer.over_sample issues up to ceil(over_sample * groups_per_step) groups
per step up front, a group the dynamic_sampling filter drops frees its place for a replacement ticket, and once the
step's batch is full the groups still in flight that no step can use are cancelled (their engine requests aborted),
so every step gets groups_per_step informative groups without waiting on replacements one at a time.
trainer.kl.coef > 0 wraps the loss in a KL penalty against the reference model (k1 / k2 / k3).
"""

from __future__ import annotations

from collections.abc import Callable

from rlfleet.config import TrainerConfig
from rlfleet.plugins import PluginError, load_callable
from rlfleet.protocols import AdvantageEstimator, LossFn
from services.trainer.advantages import ADVANTAGES, Gae
from services.trainer.losses import LOSSES, KlPenalizedLoss

# preset -> (advantage name, loss name)
PRESETS: dict[str, tuple[str, str]] = {
    "grpo": ("grpo", "clipped_pg"),
    "drgrpo": ("drgrpo", "drgrpo"),
    "gspo": ("grpo", "gspo"),
    "ppo": ("gae", "clipped_pg"),
    "reinforce_pp": ("reinforce_pp", "clipped_pg"),
    "reinforce_pp_baseline": ("reinforce_pp_baseline", "clipped_pg"),
    "dapo": ("grpo", "dapo"),
    "distill": ("distill", "clipped_pg"),
    "sft": ("sft", "sft"),
}

# advantages that need the trainer config
ADVANTAGE_FACTORIES: dict[str, Callable[[TrainerConfig], AdvantageEstimator]] = {
    "gae": lambda cfg: Gae(cfg.critic.gamma, cfg.critic.lam),
}


def resolve_advantage(name: str, cfg: TrainerConfig | None = None) -> AdvantageEstimator:
    if name in ADVANTAGES:
        return ADVANTAGES[name]
    if name in ADVANTAGE_FACTORIES:
        return ADVANTAGE_FACTORIES[name](cfg or TrainerConfig())
    if ":" in name:
        return load_callable(name, "advantage")
    known = sorted([*ADVANTAGES, *ADVANTAGE_FACTORIES])
    raise PluginError(f"advantage '{name}': not a built-in ({', '.join(known)}) "
                      "nor a dotted path 'package.module:attribute'")


def resolve_loss(name: str, cfg: TrainerConfig) -> LossFn:
    if name in LOSSES:
        return LOSSES[name](cfg)
    if ":" in name:
        return load_callable(name, "loss")
    raise PluginError(f"loss '{name}': not a built-in ({', '.join(sorted(LOSSES))}) "
                      "nor a dotted path 'package.module:attribute'")


def resolve(cfg: TrainerConfig) -> tuple[AdvantageEstimator, LossFn]:
    """The advantage estimator and loss for this trainer config; raises PluginError naming the bad field."""
    if cfg.algorithm not in PRESETS:
        raise PluginError(f"trainer.algorithm '{cfg.algorithm}': unknown preset (known: {', '.join(sorted(PRESETS))})")
    adv_name, loss_name = PRESETS[cfg.algorithm]
    advantage, loss = resolve_advantage(cfg.advantage or adv_name, cfg), resolve_loss(cfg.loss or loss_name, cfg)
    if cfg.kl.coef > 0:
        loss = KlPenalizedLoss(loss, cfg.kl.coef, cfg.kl.estimator)
    return advantage, loss


def needs_critic(cfg: TrainerConfig) -> bool:
    return (cfg.advantage or PRESETS.get(cfg.algorithm, ("", ""))[0]) == "gae"


def needs_teacher(cfg: TrainerConfig) -> bool:
    return (cfg.advantage or PRESETS.get(cfg.algorithm, ("", ""))[0]) == "distill"
