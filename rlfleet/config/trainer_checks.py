"""The trainer's start-up refusals that need only the config: no model, no process group, no service import.

`check_trainer(cfg)` is called by the trainer at start-up (rlfleet/services/trainer/service.py `validate`) and by
`rlfleet check` / `rlfleet run` before anything starts (rlfleet/local/preflight.py), so a config that checks is a
config the trainer accepts; each refusal is a ConfigError with the same message in both places. What needs the
running trainer (WORLD_SIZE of the launched ranks, the endpoints the launcher fills, the model's modules) stays in
the trainer.
"""

from __future__ import annotations

from rlfleet.config.algorithms import advantage_name, advantage_spec, needs_critic, needs_teacher
from rlfleet.config.loading import ConfigError
from rlfleet.config.root import Config
from rlfleet.config.trainer import TrainerConfig


def megatron_data_parallel_size(t: TrainerConfig, world_size: int) -> int:
    """Megatron's data-parallel ranks: world_size / (tensor_parallel * pipeline_parallel), at least 1."""
    m = t.megatron
    return max(world_size // (m.tensor_parallel * m.pipeline_parallel), 1)


def data_parallel_ranks(t: TrainerConfig) -> int:
    """How many slices trainer.world_size ranks split a batch into: every rank (fsdp) or Megatron's data-parallel
    ranks (the trainer's backend registry, rlfleet/services/trainer/backends/, gives the same number)."""
    return megatron_data_parallel_size(t, t.world_size) if t.backend == "megatron" else t.world_size


def megatron_unsupported(t: TrainerConfig) -> list[str]:
    """Trainer features the Megatron backend does not implement (yet), as config field names."""
    checks = {
        "trainer.lora.rank > 0": t.lora.rank > 0,
        "trainer.packing.enabled": t.packing.enabled,
        "trainer.routing_replay": t.routing_replay,
        "trainer.kl.coef > 0": t.kl.coef > 0,
        f"trainer.algorithm {t.algorithm} (a critic)": needs_critic(t),
        f"trainer.algorithm {t.algorithm} (a teacher model)": needs_teacher(t),
        "trainer.on_policy": t.on_policy,
        "trainer.policy_loss.entropy_coef > 0": t.policy_loss.entropy_coef > 0,
        "trainer.masking.top_entropy_quantile < 1": t.masking.top_entropy_quantile < 1,
    }
    return [name for name, used in checks.items() if used]


def check_megatron(t: TrainerConfig) -> None:
    """Raise ConfigError when trainer.backend megatron is asked for a feature it does not implement."""
    missing = megatron_unsupported(t)
    if missing:
        raise ConfigError(f"trainer.backend megatron does not support {', '.join(missing)}; use the fsdp backend")


def check_trainer(cfg: Config) -> None:
    """Raise ConfigError for a trainer section the trainer refuses at start-up from its values alone."""
    t = cfg.trainer
    if t.backend == "megatron" and t.world_size % (t.megatron.tensor_parallel * t.megatron.pipeline_parallel):
        raise ConfigError(f"trainer.world_size={t.world_size} is not a multiple of trainer.megatron.tensor_parallel*"
                          f"pipeline_parallel={t.megatron.tensor_parallel}*{t.megatron.pipeline_parallel}")
    data_world = data_parallel_ranks(t)
    if t.groups_per_step % (data_world * t.minibatches):
        raise ConfigError(f"trainer.groups_per_step={t.groups_per_step} must be divisible by data-parallel "
                          f"ranks*minibatches={data_world}*{t.minibatches}: each rank trains on whole groups")
    if t.backend == "megatron":
        check_megatron(t)
    if needs_teacher(t) and not t.teacher.model_path:
        raise ConfigError(f"trainer.algorithm {t.algorithm} needs trainer.teacher.model_path")
    missing = advantage_spec(t).missing
    if missing:
        raise ConfigError(f"trainer advantage {advantage_name(t)} needs {missing}")
    if t.masking.top_entropy_quantile < 1 and data_world > 1:
        raise ConfigError(f"trainer.masking.top_entropy_quantile < 1 takes the quantile of the whole batch's "
                          f"entropies; it runs on one data-parallel rank only (here {data_world})")
    check_profile(cfg)
    check_model_specs_place(cfg)


def check_model_specs_place(cfg: Config) -> None:
    """model.specs replace torch modules: the FSDP trainer and the torch engine apply them; a backend or engine running
    its own model code would silently run without them, so the combination is refused."""
    if not cfg.model.specs:
        return
    if cfg.trainer.backend != "fsdp":
        raise ConfigError(f"model.specs are applied by the fsdp trainer backend; trainer.backend is "
                          f"{cfg.trainer.backend}")
    if cfg.rollout.engine != "torch":
        raise ConfigError(f"model.specs are applied by the torch engine; rollout.engine is {cfg.rollout.engine}, "
                          f"which runs its own model code (its logprobs would not be the trainer's model's)")


def check_profile(cfg: Config) -> None:
    """trainer.profile: steps the run has, and a rollout trace only from an engine that can take one."""
    p, steps = cfg.trainer.profile, cfg.trainer.steps
    beyond = [s for s in p.steps if s >= steps]
    if beyond:
        raise ConfigError(f"trainer.profile.steps {beyond} are beyond the run: steps count from 0 and "
                          f"trainer.steps={steps}")
    if p.steps and p.rollout and cfg.rollout.engine != "torch":
        raise ConfigError(f"trainer.profile.rollout traces the torch engine's decode; rollout.engine is "
                          f"{cfg.rollout.engine} (set trainer.profile.rollout: false, or use the engine's own "
                          f"profiler)")
