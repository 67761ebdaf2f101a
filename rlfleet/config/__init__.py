"""The run config: one YAML file, one typed section per service; errors name the field and the file.

One module per section: run.py (run, model, eval, dashboards), rollout.py, buffer.py, trainer.py, weight_sync.py,
security.py, deployment.py (endpoints, placement), perf.py (the fast paths' off-switches); root.py is the whole config
and its cross-section checks, loading.py reads YAML and `--set` overrides, section.py is every section's base,
algorithms.py the records of the trainer's algorithm presets and advantage estimators, trainer_checks.py the
trainer's start-up refusals that need only the config (`rlfleet check` runs them too), field_docs.py how a field's
type and default read, explain.py `rlfleet check --explain FIELD`.
Everything public is importable from here: `from rlfleet.config import Config, load_config`.

Every field's description lives in its model; `python scripts/gen_config_docs.py` writes docs/config-reference.md and
the run-config part of the Helm values schema from them (tests/unit/config/test_config_docs.py fails when either
drifts). `rlfleet check CONFIG` validates a file without starting anything.
"""

from __future__ import annotations

from rlfleet.config.algorithms import (
    ADVANTAGE_SPECS,
    ALGORITHM_PRESETS,
    LOSS_NAMES,
    AdvantageSpec,
    AlgorithmPreset,
    advantage_name,
    advantage_spec,
    needs_critic,
    needs_groups,
    needs_reward_baseline,
    needs_teacher,
    reads_only_rewards,
)
from rlfleet.config.buffer import (
    BufferConfig,
)
from rlfleet.config.deployment import (
    EndpointsConfig,
    PlacementConfig,
    ServicePlacement,
)
from rlfleet.config.explain import (
    config_fields,
    explain,
)
from rlfleet.config.loading import (
    ConfigError,
    apply_overrides,
    dump_config,
    load_config,
    parse_config,
)
from rlfleet.config.model_specs import (
    ModuleSpecConfig,
)
from rlfleet.config.perf import (
    CpuPerf,
    EnginePerf,
    PerfConfig,
    RolloutPerf,
    TrainerPerf,
)
from rlfleet.config.policy_losses import (
    ClipCovConfig,
    KlCovConfig,
    MaskingConfig,
)
from rlfleet.config.profile import (
    ProfileConfig,
)
from rlfleet.config.rollout import (
    DataConfig,
    EngineHealthConfig,
    OpenAIEndpointConfig,
    RolloutConfig,
    SamplingConfig,
    SGLangConfig,
)
from rlfleet.config.root import (
    MOVED_FIELDS,
    Config,
)
from rlfleet.config.run import (
    DashboardsConfig,
    EvalConfig,
    ModelConfig,
    RunConfig,
)
from rlfleet.config.section import (
    Section,
)
from rlfleet.config.security import (
    SecurityConfig,
)
from rlfleet.config.trainer import (
    CriticConfig,
    DapoConfig,
    DrGrpoConfig,
    EstimatorConfig,
    GspoConfig,
    KlConfig,
    LoraConfig,
    MegatronConfig,
    PackingConfig,
    PolicyLossConfig,
    SchedulerConfig,
    TeacherConfig,
    TisConfig,
    TrainerConfig,
)
from rlfleet.config.trainer_checks import (
    check_megatron,
    check_trainer,
    data_parallel_ranks,
    megatron_data_parallel_size,
    megatron_unsupported,
)
from rlfleet.config.weight_sync import (
    WeightSyncConfig,
)

__all__ = [
    "ADVANTAGE_SPECS",
    "ALGORITHM_PRESETS",
    "AdvantageSpec",
    "AlgorithmPreset",
    "BufferConfig",
    "ClipCovConfig",
    "Config",
    "ConfigError",
    "CpuPerf",
    "CriticConfig",
    "DapoConfig",
    "DashboardsConfig",
    "DataConfig",
    "DrGrpoConfig",
    "EndpointsConfig",
    "EngineHealthConfig",
    "EnginePerf",
    "EstimatorConfig",
    "EvalConfig",
    "GspoConfig",
    "KlConfig",
    "KlCovConfig",
    "LOSS_NAMES",
    "LoraConfig",
    "MaskingConfig",
    "MOVED_FIELDS",
    "MegatronConfig",
    "ModelConfig",
    "ModuleSpecConfig",
    "OpenAIEndpointConfig",
    "PackingConfig",
    "PerfConfig",
    "PlacementConfig",
    "PolicyLossConfig",
    "ProfileConfig",
    "RolloutConfig",
    "RolloutPerf",
    "RunConfig",
    "SGLangConfig",
    "SamplingConfig",
    "SchedulerConfig",
    "Section",
    "SecurityConfig",
    "ServicePlacement",
    "TeacherConfig",
    "TisConfig",
    "TrainerConfig",
    "TrainerPerf",
    "WeightSyncConfig",
    "advantage_name",
    "advantage_spec",
    "apply_overrides",
    "check_megatron",
    "check_trainer",
    "config_fields",
    "data_parallel_ranks",
    "dump_config",
    "explain",
    "load_config",
    "megatron_data_parallel_size",
    "megatron_unsupported",
    "needs_critic",
    "needs_groups",
    "needs_reward_baseline",
    "needs_teacher",
    "parse_config",
    "reads_only_rewards",
]
