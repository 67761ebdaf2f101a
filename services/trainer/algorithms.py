"""Algorithm presets: trainer.algorithm names an (advantage, loss) pair; trainer.advantage / trainer.loss override."""

from __future__ import annotations

from rlfleet.config import TrainerConfig
from rlfleet.plugins import PluginError, load_callable
from rlfleet.protocols import AdvantageEstimator, LossFn
from services.trainer.advantages import ADVANTAGES
from services.trainer.losses import LOSSES

# preset -> (advantage name, loss name)
PRESETS: dict[str, tuple[str, str]] = {"grpo": ("grpo", "clipped_pg")}


def resolve_advantage(name: str) -> AdvantageEstimator:
    if name in ADVANTAGES:
        return ADVANTAGES[name]
    if ":" in name:
        return load_callable(name, "advantage")
    raise PluginError(f"advantage '{name}': not a built-in ({', '.join(sorted(ADVANTAGES))}) "
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
    return resolve_advantage(cfg.advantage or adv_name), resolve_loss(cfg.loss or loss_name, cfg)
