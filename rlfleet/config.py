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


class EngineHealthConfig(_Section):
    """A replica's health follows its engine: after `failures` failed checks `interval` seconds apart (a dead
    server refuses at once; a frozen one times out after 3 s) the replica turns NOT_SERVING and exits to be
    replaced. Worst-case detection of a frozen SGLang server: failures * (interval + 3 s)."""

    interval: float = Field(2.0, gt=0)
    failures: int = Field(3, ge=1)


class SGLangConfig(_Section):
    """rollout.engine: sglang. Each replica starts its own server (url empty) with a fresh random API key, or uses
    the server at url (api_key_file holds that server's key). RLFLEET_SGLANG_URL, RLFLEET_SGLANG_PYTHON and
    RLFLEET_SGLANG_PYTHONPATH in the environment override url, python and pythonpath (a machine's own paths)."""

    url: str = ""                            # an SGLang server someone else runs ("" = start one per replica)
    api_key_file: str = ""                   # that server's --api-key, for url
    python: str = ".venv-sglang/bin/python"  # the python of SGLang's own environment (in the CUDA image: python)
    pythonpath: list[str] = []               # extra PYTHONPATH of a server this replica starts
    weights: Literal["disk", "distributed"] = "disk"   # how verified weights reach the server
    verify: Literal["read_back", "sent"] = "read_back"  # what the acknowledged digest is computed from
    tp: int = Field(1, ge=1)                 # tensor parallelism over this many GPUs (the rollout pod's GPUs)
    mem_fraction_static: float = Field(0.1, gt=0, lt=1)   # GPU memory for weights + KV cache (0.8-0.9 on a GPU)
    max_total_tokens: int = Field(4096, ge=64)           # KV cache size in tokens
    extra_args: list[str] = []               # more sglang.launch_server flags, verbatim


class DataConfig(_Section):
    """rollout.data / eval.data: a dataset by path (JSONL, Parquet, or a saved Hugging Face `datasets` folder)."""

    path: str
    prompt_field: str | None = None         # a text column (sent as one user message when chat is true)
    messages_field: str | None = None       # or a column of chat messages [{role, content}, ...]
    label_field: str | None = None
    extra_fields: list[str] | None = None   # columns given to the reward as keyword arguments (None: all others)
    chat: bool = True                       # prompt_field: apply the model's chat template
    system_prompt: str | None = None
    shuffle: bool = True                    # a new seeded order each epoch
    seed: int | None = None                 # default: run.seed
    holdout: float = Field(0.0, ge=0)       # rows held out of "train": a fraction (< 1) or a count (>= 1)
    split: Literal["train", "holdout", "all"] = "train"
    dataset_split: str = "train"            # saved DatasetDict folders: which split to read

    @model_validator(mode="after")
    def _one_prompt_field(self) -> DataConfig:
        if (self.prompt_field is None) == (self.messages_field is None):
            raise ValueError("give exactly one of prompt_field and messages_field")
        return self


class RolloutConfig(_Section):
    replicas: int = Field(1, ge=1)
    engine: Literal["torch", "sglang"] = "torch"
    group_size: int = Field(8, ge=1)
    data_source: str | None = None       # dotted path to a DataSource factory (or give `data`)
    data_args: dict[str, Any] = {}
    data: DataConfig | None = None       # a dataset file instead of data_source
    reward_fn: str                       # a stock reward name (rlfleet/rewards) or a dotted path to a RewardFn
    reward_args: dict[str, Any] = {}     # options of a stock reward (or kwargs of a dotted-path reward factory)
    reward_timeout: float = Field(60.0, gt=0)   # seconds; a reward that takes longer fails its sample
    rollout_fn: str = "services.rollout.rollout_fns:single_turn"
    sampling: SamplingConfig = SamplingConfig()
    max_batch_size: int = Field(64, ge=1)   # concurrent sequences in the engine
    claim_groups: int = Field(4, ge=1)      # groups asked for per Claim
    device: str = "cpu"
    # on a weight update, in-flight generations: "continue" in place (each token records the version that produced
    # it) or "retract" (dropped from the engine and regenerated from the prompt under the new weights)
    partial_rollouts: Literal["continue", "retract"] = "continue"
    health: EngineHealthConfig = EngineHealthConfig()
    sglang: SGLangConfig = SGLangConfig()
    # on SIGTERM (scaled away, pod deleted): stop claiming, let the groups in flight finish for up to this many
    # seconds, then hand the rest back to the buffer (re-queued at once) and exit
    drain_seconds: float = Field(30.0, ge=0)


class BufferConfig(_Section):
    store: Literal["embedded", "redis"] = "embedded"
    redis_url: str = "redis://127.0.0.1:6379/0"
    capacity: int = Field(1024, ge=1)       # samples held (stored + in flight) before back-pressure
    max_staleness: int = Field(0, ge=0)     # 0 = synchronous RL; k = samples may lag k versions
    lease_seconds: float = Field(300.0, gt=0)
    filters: list[str] = []                 # dotted paths to SampleFilters, or built-in names
    min_valid_per_group: int = Field(2, ge=1)
    # embedded store durability. always: a reply waits for its commit's fsync (group commit: concurrent calls share
    # one). everysec: loses up to ~1 s of acknowledged samples, deliveries and acks on power loss. no: loses
    # whatever the OS had not written back on power loss. (A process crash loses nothing under any of them.)
    fsync: Literal["always", "everysec", "no"] = "always"
    # issue up to ceil(over_sample * trainer.groups_per_step) groups per step (DAPO over-sampling); when a step's
    # batch is full, groups in flight that the staleness bound no longer lets feed a step are cancelled
    over_sample: float = Field(1.0, ge=1.0, le=16.0)


class TisConfig(_Section):
    """Rollout correction: importance weights of the trainer's vs the rollout engine's policy (losses.py)."""

    mode: Literal["tis", "icepop", "mask", "none"] = "tis"   # mask = icepop: weight 1 inside [low, clip], else 0
    clip: float = Field(2.0, gt=0)          # tis: weights truncated at clip; icepop/mask: kept in [low, clip]
    low: float = Field(0.5, ge=0)
    # the ratio the weight is taken of: per token, the sequence's product (exp of the summed log-ratios) or its
    # geometric mean (exp of the mean log-ratio), broadcast over the sequence's tokens
    level: Literal["token", "sequence", "geometric"] = "token"


class MegatronConfig(_Section):
    """trainer.backend: megatron. world_size = tensor_parallel * pipeline_parallel * data-parallel ranks."""

    tensor_parallel: int = Field(1, ge=1)
    pipeline_parallel: int = Field(1, ge=1)
    microbatches: int = Field(1, ge=1)      # schedule microbatches per minibatch (pipelining depth)


class KlConfig(_Section):
    """Optional KL penalty against the reference model (the initial policy), added to the loss or the reward."""

    coef: float = Field(0.0, ge=0)          # 0: no reference model is loaded
    # k3 = low_var_kl (clamped, verl's bounds); mse = k2; kl = k1; a trailing "+" keeps the value of the estimator
    # and takes the gradient of k2 (straight-through, unbiased gradient)
    estimator: Literal["k1", "k2", "k3", "kl", "mse", "abs", "low_var_kl",
                       "k1+", "k2+", "k3+", "kl+", "mse+", "abs+", "low_var_kl+"] = "k3"
    in_reward: bool = False                 # True: -coef * KL(old || ref) per token in the reward (verl's
    #                                         use_kl_in_reward), not in the loss
    ratio_weighted: bool = False            # TRL's use_bias_correction_kl: the loss's KL times the ratio pi/pi_old


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


# issue 13: verl / TRL parity (services/trainer/losses.py, advantages.py, batch_invariant.py)
LossAgg = Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                  "bnpo", "dapo", "grpo", "dr_grpo"]   # TRL's loss_type names are aliases (losses.AGG_ALIASES)


class PolicyLossConfig(_Section):
    """The token-level policy losses (clipped_pg, dapo, drgrpo, ppo's): aggregation, dual-clip, clamps, entropy."""

    agg: LossAgg | None = None              # None: the loss's own (token-mean; drgrpo: seq-mean-token-sum-norm)
    # sequence-level denominators: "exclude" rows without a valid token (verl), or "include" them (TRL)
    empty_rows: Literal["exclude", "include"] = "exclude"
    clip_ratio_c: float = Field(3.0, ge=0)  # dual-clip: a negative-advantage token's loss is at most -A * c (0: off)
    log_ratio_clamp: float = Field(20.0, gt=0)   # log(pi/pi_old) clamped to +-this before exp (verl: 20)
    kl_clamp: float = Field(10.0, gt=0)          # k3 / low_var_kl clamped to +-this (verl: 10)
    entropy_coef: float = Field(0.0, ge=0)       # loss -= coef * token-mean entropy (0: entropy is a metric only)


class EstimatorConfig(_Section):
    """Options of the advantage estimators."""

    scale_rewards: Literal["group", "batch", "none"] = "group"   # GRPO's std: per group, over the batch, or off
    gamma: float = Field(1.0, ge=0, le=1)   # REINFORCE++'s discount over the response tokens


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
    max_seq_len: int | None = Field(None, ge=2, description=(
        "Longest sample (prompt + response tokens) the trainer trains on; a delivered group holding a longer one is "
        "quarantined (Buffer.Reject) rather than trained on. None: no limit."))
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
    # issue 13: verl / TRL parity
    policy_loss: PolicyLossConfig = PolicyLossConfig()
    estimator: EstimatorConfig = EstimatorConfig()
    # true on-policy: engine and trainer compute log-probs with the same batch-invariant CPU kernels
    # (services/batch_invariant.py), so logprob_abs_diff is exactly 0; torch engine + fsdp on CPU, fp32 only
    on_policy: bool = False


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
    data_plane_tls: bool = Field(True, description=(
        "security.mode mtls: serve the gRPC weight data plane (bucketed, broadcast's fallback) over mTLS too. False: "
        "plaintext, each Fetch carrying a random token the manifest brings over the mTLS control plane. Needs signed "
        "weights (replicas refuse such a version without the run's public key: integrity stays); loses the weights' "
        "confidentiality on the wire and lets anyone who sees the traffic fetch staged versions."))


class EvalConfig(_Section):
    data_source: str | None = None          # dotted path to a DataSource factory (held-out prompts)
    data_args: dict[str, Any] = {}
    data: DataConfig | None = None          # a dataset file (default: rollout.data's holdout split, if any)
    reward_fn: str | None = None            # default: rollout.reward_fn
    reward_args: dict[str, Any] | None = None   # default: rollout.reward_args when reward_fn is unset
    every_steps: int = Field(0, ge=0)       # 0: only before and after training
    max_prompts: int = Field(200, ge=1)
    max_new_tokens: int | None = None


class DashboardsConfig(_Section):
    """Where trainer metrics go besides metrics/trainer.jsonl and Prometheus."""

    tensorboard: bool = False               # event files in RUN_DIR/tensorboard
    wandb: Literal["off", "offline", "online"] = "off"   # offline: RUN_DIR/wandb, no network
    wandb_project: str = "rlfleet"


class SecurityConfig(_Section):
    # mtls: a run CA and a certificate per component, roles per RPC (rlfleet/security); token: one shared token,
    # no roles, no TLS; none: nothing (explicit local experiments only; every service warns)
    mode: Literal["mtls", "token", "none"] = "mtls"
    token_file: str | None = None             # token mode: the launcher writes a fresh one in the run folder
    pki_dir: str | None = None                # mtls: ca.crt, NAME.crt, NAME.key (0600); the launcher makes them
    signing_key: str | None = None            # Ed25519 private key (PEM) signing weights/checkpoints: trainer only
    signing_public_key: str | None = None     # its public key: replicas and the trainer refuse what it did not sign
    version_lead: int = Field(1, ge=0)        # Put/Claim weight_version may lead the trainer's policy version by this
    metrics_bind: str = "127.0.0.1"           # where /metrics listens (the chart sets 0.0.0.0 for Prometheus)


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
    dashboards: DashboardsConfig = DashboardsConfig()
    security: SecurityConfig = SecurityConfig()
    endpoints: EndpointsConfig = EndpointsConfig()
    placement: PlacementConfig = PlacementConfig()
    perf: PerfConfig = PerfConfig()

    @model_validator(mode="after")
    def _check(self) -> Config:
        if self.rollout.group_size < 2 and self.trainer.algorithm in ("grpo", "dapo", "gspo", "drgrpo",
                                                                        "reinforce_pp_baseline", "rloo"):
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
