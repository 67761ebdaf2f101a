"""The run config: one YAML file, one typed section per service. Errors name the field and the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """The config file is missing, unreadable, or has a wrong field."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunConfig(_Section):
    name: str = "run"
    dir: str = "runs/{name}"             # the run folder: metrics, checkpoints, logs, resolved config
    seed: int = 0
    resume: bool = False                 # continue from the newest checkpoint in dir


class ModelConfig(_Section):
    path: str                            # HF causal-LM folder (safetensors); may use {run_dir}
    prepare: str | None = None           # dotted path: fn(model_dir: str, seed: int) builds the folder if missing
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class SamplingConfig(_Section):
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    max_new_tokens: int = Field(64, ge=1)


class RolloutConfig(_Section):
    replicas: int = Field(1, ge=1)
    engine: Literal["torch", "sglang"] = "torch"
    group_size: int = Field(8, ge=1)
    data_source: str                     # dotted path to a DataSource factory
    data_args: dict[str, Any] = {}
    reward_fn: str                       # dotted path to a RewardFn
    rollout_fn: str = "services.rollout.rollout_fns:single_turn"
    sampling: SamplingConfig = SamplingConfig()
    max_batch_size: int = Field(64, ge=1)   # concurrent sequences in the engine
    claim_groups: int = Field(4, ge=1)      # groups asked for per Claim
    device: str = "cpu"
    # on a weight update, in-flight generations: "continue" in place (each token records the version that produced
    # it) or "retract" (dropped from the engine and regenerated from the prompt under the new weights)
    partial_rollouts: Literal["continue", "retract"] = "continue"


class BufferConfig(_Section):
    store: Literal["embedded", "redis"] = "embedded"
    redis_url: str = "redis://127.0.0.1:6379/0"
    capacity: int = Field(1024, ge=1)       # samples held (stored + in flight) before back-pressure
    max_staleness: int = Field(0, ge=0)     # 0 = synchronous RL; k = samples may lag k versions
    lease_seconds: float = Field(300.0, gt=0)
    filters: list[str] = []                 # dotted paths to SampleFilters, or built-in names
    min_valid_per_group: int = Field(2, ge=1)
    fsync: Literal["always", "everysec", "no"] = "everysec"
    # issue up to ceil(over_sample * trainer.groups_per_step) groups per step (DAPO over-sampling); when a step's
    # batch is full, groups in flight that the staleness bound no longer lets feed a step are cancelled
    over_sample: float = Field(1.0, ge=1.0, le=16.0)


class TisConfig(_Section):
    mode: Literal["tis", "icepop", "none"] = "tis"
    clip: float = Field(2.0, gt=0)          # tis: weights truncated at clip; icepop: kept in [low, clip]
    low: float = Field(0.5, ge=0)


class MegatronConfig(_Section):
    """trainer.backend: megatron. world_size = tensor_parallel * pipeline_parallel * data-parallel ranks."""

    tensor_parallel: int = Field(1, ge=1)
    pipeline_parallel: int = Field(1, ge=1)
    microbatches: int = Field(1, ge=1)      # schedule microbatches per minibatch (pipelining depth)


class KlConfig(_Section):
    """Optional KL penalty against the reference model (the initial policy), added to the loss."""

    coef: float = Field(0.0, ge=0)          # 0: no reference model is loaded
    estimator: Literal["k1", "k2", "k3"] = "k3"   # k3 = the low-variance estimator


class CriticConfig(_Section):
    """PPO's critic: a second HF model (model_path; default the policy's folder) with a scalar value head."""

    model_path: str | None = None
    lr: float = Field(1e-5, gt=0)
    value_clip: float = Field(0.2, ge=0)    # clip of the value update around the old values (0: none)
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(0.95, ge=0, le=1)


class TeacherConfig(_Section):
    """On-policy distillation: the teacher's logprobs are computed in the trainer from this HF folder."""

    model_path: str | None = None


class LoraConfig(_Section):
    """LoRA: train rank-r adapters on the target Linear layers only; publish adapter weights only."""

    rank: int = Field(0, ge=0)              # 0: LoRA off (full fine-tuning)
    alpha: float = Field(16.0, gt=0)
    targets: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]   # Linear module names (last path part)


class SchedulerConfig(_Section):
    """Learning rate over trainer steps: linear warmup to trainer.lr, then constant or cosine to min_ratio * lr."""

    kind: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    min_ratio: float = Field(0.0, ge=0, le=1)


class PackingConfig(_Section):
    """Sequence packing: samples share rows of up to max_tokens tokens; no attention across samples."""

    enabled: bool = False
    max_tokens: int = Field(2048, ge=8)


class TrainerConfig(_Section):
    backend: Literal["fsdp", "megatron"] = "fsdp"
    megatron: MegatronConfig = MegatronConfig()
    world_size: int = Field(1, ge=1)
    steps: int = Field(100, ge=1)
    groups_per_step: int = Field(8, ge=1)
    algorithm: str = "grpo"                 # preset naming an advantage and a loss
    advantage: str | None = None            # override: built-in name or dotted path
    loss: str | None = None                 # override: built-in name or dotted path
    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = Field(1.0, gt=0)
    clip_low: float = Field(0.2, ge=0)
    clip_high: float = Field(0.2, ge=0)
    minibatches: int = Field(1, ge=1)
    tis: TisConfig = TisConfig()
    publish_every: int = Field(1, ge=1)
    checkpoint_every: int = Field(10, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    hooks: list[str] = []
    threads: int | None = Field(None, ge=1)  # torch threads per rank; None: placement.trainer (issue 15)
    device: str = "cpu"
    routing_replay: bool = False            # MoE: replay the rollout's expert routes (R3, trainer/routing_replay.py)
    # issue 5: algorithms, precision, packing, LoRA, scheduler
    kl: KlConfig = KlConfig()
    critic: CriticConfig = CriticConfig()
    teacher: TeacherConfig = TeacherConfig()
    lora: LoraConfig = LoraConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    packing: PackingConfig = PackingConfig()
    precision: Literal["auto", "bf16", "fp32"] = "auto"   # auto: bf16 compute + fp32 master on CUDA, fp32 on CPU
    activation_checkpointing: bool = False
    dapo_clip_high: float = Field(0.28, ge=0)             # DAPO's clip-higher (clip_low stays trainer.clip_low)
    gspo_clip: tuple[float, float] = (3e-4, 4e-4)         # GSPO's sequence-ratio clip range (low, high)
    drgrpo_max_tokens: int = Field(0, ge=0)               # Dr. GRPO's constant normaliser (0: the batch's T)


class WeightSyncConfig(_Section):
    # bucketed: gRPC stream; broadcast: gloo/NCCL group (gRPC stream for replicas outside it); nixl: P2P WRITEs;
    # disk_delta: changed elements in files under delta_dir; auto: probe at start-up, pick by model size
    transport: Literal["bucketed", "broadcast", "nixl", "disk_delta", "auto"] = "bucketed"
    bucket_mb: float = Field(512.0, gt=0)
    chunk_kb: int = Field(1024, ge=16)      # gRPC streaming chunk size
    update_timeout: float = Field(120.0, gt=0)
    pause_mode: Literal["in_place", "retract"] = "in_place"   # while loading: keep in-flight requests, or abort them
    join_seconds: float = Field(60.0, gt=0)  # broadcast: how long the trainer waits for replicas to join the group
    group_host: str = ""                     # broadcast rendezvous host ("" = the host of endpoints.trainer_data)
    delta_dir: str = ""                      # disk_delta: shared folder ("" = RUN_DIR/weights_delta)
    delta_encoding: Literal["xor", "overwrite"] = "xor"
    rebase_every: int = Field(50, ge=1)      # disk_delta: a full base every this many versions


class EvalConfig(_Section):
    data_source: str | None = None          # dotted path to a DataSource factory (held-out prompts)
    data_args: dict[str, Any] = {}
    reward_fn: str | None = None            # default: rollout.reward_fn
    every_steps: int = Field(0, ge=0)       # 0: only before and after training
    max_prompts: int = Field(200, ge=1)
    max_new_tokens: int | None = None


class SecurityConfig(_Section):
    mode: Literal["token", "none"] = "token"  # "none" only for explicit local experiments
    token_file: str | None = None             # the launcher writes a fresh one in the run folder


class EndpointsConfig(_Section):
    """host:port of each service. The launcher fills these with free loopback ports."""

    buffer: str = ""
    weight_sync: str = ""
    trainer: str = ""
    rollout: list[str] = []
    trainer_data: str = ""                    # trainer's weight data plane (bucketed over gRPC)
    rendezvous: str = ""                      # torch.distributed master addr:port for trainer ranks


# issue 15: speed. Cores per local service (rlfleet/placement.py) and the fast paths' off-switches.
class ServicePlacement(_Section):
    """One local service's (each trainer rank's, each rollout replica's) share of the cores; None: derived."""

    cores: int | None = Field(None, ge=1)      # CPUs it is pinned to (sched_setaffinity)
    threads: int | None = Field(None, ge=1)    # torch intra-op threads (default: its cores)


class PlacementConfig(_Section):
    pin: bool = True                           # pin each service to its cores (off: threads only)
    trainer: ServicePlacement = ServicePlacement()
    rollout: ServicePlacement = ServicePlacement()
    buffer: ServicePlacement = ServicePlacement()
    weight_sync: ServicePlacement = ServicePlacement()


class PerfConfig(_Section):
    single_pass: bool = True                   # minibatches 1: old logprobs from the training forward
    engine_fast_decode: bool = True            # torch engine: lean Llama-family decode step (fast_decode.py)
    engine_compile: bool = False               # torch engine: torch.compile that step (needs a compiler; slow start)


class Config(_Section):
    run: RunConfig = RunConfig()
    model: ModelConfig
    rollout: RolloutConfig
    buffer: BufferConfig = BufferConfig()
    trainer: TrainerConfig = TrainerConfig()
    weight_sync: WeightSyncConfig = WeightSyncConfig()
    eval: EvalConfig = EvalConfig()
    security: SecurityConfig = SecurityConfig()
    endpoints: EndpointsConfig = EndpointsConfig()
    placement: PlacementConfig = PlacementConfig()
    perf: PerfConfig = PerfConfig()

    @model_validator(mode="after")
    def _check(self) -> Config:
        if self.rollout.group_size < 2 and self.trainer.algorithm in ("grpo", "dapo", "gspo", "drgrpo",
                                                                        "reinforce_pp_baseline"):
            raise ValueError(f"rollout.group_size must be >= 2 for trainer.algorithm={self.trainer.algorithm}")
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir.format(name=self.run.name))

    @property
    def model_path(self) -> Path:
        return Path(self.model.path.format(run_dir=self.run_dir, name=self.run.name))


def _format_errors(exc: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = "unknown field (check the spelling)" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def parse_config(data: Any, source: str = "<config>") -> Config:
    if not isinstance(data, dict):
        raise ConfigError(f"invalid config {source}: expected a mapping at the top level")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, source)) from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {p} is not valid YAML: {exc}") from None
    if overrides:
        data = apply_overrides(data or {}, overrides)
    return parse_config(data, str(p))


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Set dotted keys ('trainer.steps': 5) in a nested mapping, returning a new mapping."""
    out = yaml.safe_load(yaml.safe_dump(data))
    for key, value in overrides.items():
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def dump_config(cfg: Config, path: Path) -> None:
    from rlfleet.atomic import write_text_atomic

    write_text_atomic(path, yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
