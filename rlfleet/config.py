"""The run config: one YAML file, one typed section per service. Errors name the field and the file. The trainer's
section and its sub-sections live in rlfleet/config_trainer.py (re-exported here); the section base in
rlfleet/config_section.py.

Every field's description lives here; `python scripts/gen_config_docs.py` writes docs/config-reference.md and the
run-config part of the Helm values schema from these models (tests/unit/test_config_docs.py fails when either drifts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from rlfleet.config_section import Section
from rlfleet.config_trainer import (  # noqa: F401 - re-exported: rlfleet.config is where sections are found
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


class ConfigError(ValueError):
    """The config file is missing, unreadable, or has a wrong field."""




class RunConfig(Section):
    """The run's name, folder and seed."""

    name: str = Field("run", description="The run's name; `{name}` in run.dir and model.path.")
    dir: str = Field("runs/{name}", description="The run folder: metrics, checkpoints, logs, the resolved config.")
    seed: int = Field(0, description="The run's random seed.")
    resume: bool = Field(False, description="Continue from the newest checkpoint in run.dir.")


class ModelConfig(Section):
    """The policy model."""

    path: str = Field(description="HF causal-LM folder (safetensors) or a .gguf file; may use {run_dir} and {name}.")
    prepare: str | None = Field(None, description="Dotted path to fn(model_dir: str, seed: int) that builds the "
                                "folder when it is missing.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="Dtype the weights are "
                                                              "published, served and exported in.")


class SamplingConfig(Section):
    """How the rollout engine samples responses."""

    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature (0: greedy); the trainer's logprobs "
                               "use the same logits / T.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling: the smallest token set of this "
                         "probability mass (1: off).")
    top_k: int = Field(0, ge=0, description="Sample from the k most likely tokens (0: off).")
    max_new_tokens: int = Field(64, ge=1, description="Most tokens generated per response.")


class EngineHealthConfig(Section):
    """A replica's health follows its engine: after `failures` failed checks `interval` seconds apart (a dead
    server refuses at once; a frozen one times out after 3 s) the replica turns NOT_SERVING and exits to be
    replaced. Worst-case detection of a frozen SGLang server: failures * (interval + 3 s)."""

    interval: float = Field(2.0, gt=0, description="Seconds between engine health checks.")
    failures: int = Field(3, ge=1, description="Failed checks in a row that make the replica NOT_SERVING.")


class SGLangConfig(Section):
    """rollout.engine: sglang. Each replica starts its own server (url empty) with a fresh random API key, or uses
    the server at url (api_key_file holds that server's key). RLFLEET_SGLANG_URL, RLFLEET_SGLANG_PYTHON and
    RLFLEET_SGLANG_PYTHONPATH in the environment override url, python and pythonpath (a machine's own paths)."""

    url: str = Field("", description="An SGLang server someone else runs (\"\": start one per replica).")
    api_key_file: str = Field("", description="A file holding that server's --api-key, for url.")
    python: str = Field(".venv-sglang/bin/python", description="The python of SGLang's own environment (in the "
                        "CUDA image: /opt/sglang/bin/python).")
    pythonpath: list[str] = Field([], description="Extra PYTHONPATH of a server this replica starts.")
    weights: Literal["disk", "distributed"] = Field("disk", description="How verified weights reach the server: "
                                                    "files on disk, or SGLang's distributed weight update.")
    verify: Literal["read_back", "sent"] = Field("read_back", description="What the acknowledged digest is "
                                                 "computed from: the weights read back from the server, or those "
                                                 "sent.")
    tp: int = Field(1, ge=1, description="Tensor parallelism over this many GPUs (the rollout pod's GPUs).")
    mem_fraction_static: float = Field(0.1, gt=0, lt=1, description="GPU memory for weights + KV cache (0.8-0.9 "
                                       "on a GPU).")
    max_total_tokens: int = Field(4096, ge=64, description="KV cache size in tokens.")
    extra_args: list[str] = Field([], description="More sglang.launch_server flags, verbatim.")


class DataConfig(Section):
    """A dataset by path (JSONL, Parquet, or a saved Hugging Face `datasets` folder). Give exactly one of
    prompt_field and messages_field."""

    path: str = Field(description="The dataset file or folder.")
    prompt_field: str | None = Field(None, description="A text column (sent as one user message when chat is "
                                     "true).")
    messages_field: str | None = Field(None, description="Or a column of chat messages [{role, content}, ...].")
    label_field: str | None = Field(None, description="The column rewards compare with (prompt.label, as text).")
    extra_fields: list[str] | None = Field(None, description="Columns given to the reward as keyword arguments "
                                           "(null: all others).")
    chat: bool = Field(True, description="prompt_field: apply the model's chat template.")
    system_prompt: str | None = Field(None, description="A system message before each prompt (prepended to the "
                                      "text when chat is false).")
    shuffle: bool = Field(True, description="A new seeded order each epoch.")
    seed: int | None = Field(None, description="Seed of the order (null: run.seed).")
    holdout: float = Field(0.0, ge=0, description="Rows held out of \"train\": a fraction (< 1) or a count (>= 1).")
    split: Literal["train", "holdout", "all"] = Field("train", description="Which rows this section reads: the "
                                                      "training rows, the held-out rows, or all.")
    dataset_split: str = Field("train", description="Saved DatasetDict folders: which split to read.")

    @model_validator(mode="after")
    def _one_prompt_field(self) -> DataConfig:
        if (self.prompt_field is None) == (self.messages_field is None):
            raise ValueError("give exactly one of prompt_field and messages_field")
        return self


class OpenAIEndpointConfig(Section):
    """rollout.openai: each replica serves /v1/chat/completions and /v1/completions from its engine (issue 12)."""

    enabled: bool = Field(False, description="serve the OpenAI-compatible HTTP endpoint on every rollout replica")
    bind: str = Field("127.0.0.1", description="host the endpoint listens on (loopback: only this machine)")
    port: int = Field(0, ge=0, le=65535, description="replica i listens on port+i; 0: a free port (the replica "
                      "writes its address to RUN_DIR/openai/<replica>.json)")
    api_key_file: str | None = Field(None, description="mtls mode: the API key clients send as a bearer token "
                                     "(0600); default RUN_DIR/pki/openai-api.key, made by rlfleet run. token mode: "
                                     "the run token; none: no key")
    max_sessions: int = Field(4096, ge=1, description="TITO sessions held at once; the least recently used "
                              "beyond this are dropped")
    request_timeout: float = Field(600.0, gt=0, description="seconds a completion may take before it fails (504)")
    gateway_port: int = Field(0, ge=0, le=65535, description="rlfleet run also serves one entry point on bind:this "
                              "port that sends every request of a session to one replica (0: a free port; its "
                              "address is written to RUN_DIR/openai_gateway.json)")


class RolloutConfig(Section):
    """The rollout replicas: engine, prompts, reward, sampling. Give exactly one of data_source and data."""

    replicas: int = Field(1, ge=1, description="Rollout replicas (processes, each with its own engine).")
    engine: Literal["torch", "sglang"] = Field("torch", description="The inference engine: the built-in torch "
                                               "engine, or an SGLang server (rollout.sglang).")
    group_size: int = Field(8, ge=1, description="Responses sampled per prompt (one group).")
    data_source: str | None = Field(None, description="Dotted path to a DataSource factory (or give data).")
    data_args: dict[str, Any] = Field({}, description="Keyword arguments of the data_source factory.")
    data: DataConfig | None = Field(None, description="A dataset file instead of data_source.")
    reward_fn: str = Field(description="A stock reward name (rlfleet/rewards) or a dotted path to a RewardFn.")
    reward_args: dict[str, Any] = Field({}, description="Options of a stock reward (or kwargs of a dotted-path "
                                        "reward factory).")
    reward_timeout: float = Field(60.0, gt=0, description="Seconds; a reward that takes longer fails its sample.")
    rollout_fn: str = Field("rlfleet.services.rollout.rollout_fns:single_turn",
                            description="Dotted path to the RolloutFn "
                            "that turns a prompt into samples (single turn, or a multi-turn agent).")
    sampling: SamplingConfig = Field(SamplingConfig(), description="How responses are sampled.")
    max_batch_size: int = Field(64, ge=1, description="Concurrent sequences in the engine.")
    claim_groups: int = Field(4, ge=1, description="Groups asked for per Claim.")
    device: str = Field("cpu", description="Torch device of the torch engine (cpu, cuda, cuda:N).")
    partial_rollouts: Literal["continue", "retract"] = Field(
        "continue", description="On a weight update, in-flight generations: continue in place (each token records "
        "the version that produced it) or retract (dropped from the engine and regenerated from the prompt under "
        "the new weights).")
    health: EngineHealthConfig = Field(EngineHealthConfig(), description="Engine health checks.")
    sglang: SGLangConfig = Field(SGLangConfig(), description="The SGLang engine (rollout.engine: sglang).")
    drain_seconds: float = Field(30.0, ge=0, description="On SIGTERM (scaled away, pod deleted): stop claiming, let "
                                 "the groups in flight finish for up to this many seconds, then hand the rest back "
                                 "to the buffer (re-queued at once) and exit.")
    openai: OpenAIEndpointConfig = Field(OpenAIEndpointConfig(), description="The OpenAI-compatible HTTP endpoint "
                                         "on each replica, and the run's gateway.")


class BufferConfig(Section):
    """The buffer: where samples wait between rollout and trainer, and the rules that issue and drop groups."""

    store: Literal["embedded", "redis"] = Field("embedded", description="Where samples are kept: an append-only "
                                                "log in the run folder, or Redis Streams.")
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="The Redis server of store: redis.")
    capacity: int = Field(1024, ge=1, description="Samples held (stored + in flight) before back-pressure.")
    max_staleness: int = Field(0, ge=0, description="0: synchronous RL; k: samples may lag k weight versions.")
    lease_seconds: float = Field(300.0, gt=0, description="A ticket whose samples do not all arrive within this "
                                 "many seconds is re-queued (and a cancelled group is remembered this long).")
    filters: list[str] = Field([], description="Group filters: built-in names (dynamic_sampling) or dotted paths "
                               "to SampleFilters.")
    min_valid_per_group: int = Field(2, ge=1, description="A complete group with fewer valid (not failed or "
                                     "aborted) samples is dropped.")
    fsync: Literal["always", "everysec", "no"] = Field(
        "always", description="Embedded store durability. always: a reply waits for its commit's fsync (group "
        "commit: concurrent calls share one). everysec: loses up to ~1 s of acknowledged samples, deliveries and "
        "acks on power loss. no: loses whatever the OS had not written back on power loss. (A process crash loses "
        "nothing under any of them.)")
    over_sample: float = Field(1.0, ge=1.0, le=16.0, description="Issue up to ceil(over_sample * "
                               "trainer.groups_per_step) groups per step (DAPO over-sampling); when a step's batch "
                               "is full, groups in flight that the staleness bound no longer lets feed a step are "
                               "cancelled.")


class WeightSyncConfig(Section):
    """How published weights reach the rollout replicas."""

    transport: Literal["bucketed", "broadcast", "nixl", "disk_delta", "auto"] = Field(
        "bucketed", description="bucketed: gRPC stream; broadcast: gloo/NCCL group (gRPC stream for replicas "
        "outside it); nixl: P2P WRITEs; disk_delta: changed elements in files under delta_dir; auto: probe at "
        "start-up, pick by model size.")
    bucket_mb: float = Field(512.0, gt=0, description="Size of a weight bucket in MB.")
    chunk_kb: int = Field(1024, ge=16, description="gRPC streaming chunk size in KB.")
    update_timeout: float = Field(120.0, gt=0, description="Seconds a weight update may take (sending, loading, "
                                  "verifying).")
    pause_mode: Literal["in_place", "retract"] = Field("in_place", description="While loading: keep in-flight "
                                                       "requests, or abort them.")
    join_seconds: float = Field(60.0, gt=0, description="broadcast: how long the trainer waits for replicas to "
                                "join the group.")
    group_host: str = Field("", description="broadcast: rendezvous host (\"\": the host of "
                            "endpoints.trainer_data).")
    broadcast_op_timeout: float = Field(30.0, gt=0, description="broadcast: seconds one broadcast op may take on "
                                        "the trainer before the group is dropped. A frozen member stalls a publish "
                                        "this long at most; the version then goes over the gRPC stream and the "
                                        "group re-forms without it.")
    delta_dir: str = Field("", description="disk_delta: shared folder (\"\": RUN_DIR/weights_delta).")
    delta_encoding: Literal["xor", "overwrite"] = Field("xor", description="disk_delta: changed elements as XOR "
                                                        "with the base, or their new values.")
    rebase_every: int = Field(50, ge=1, description="disk_delta: a full base every this many versions.")
    data_plane_tls: bool = Field(True, description=(
        "security.mode mtls: serve the gRPC weight data plane (bucketed, broadcast's fallback) over mTLS too. False: "
        "plaintext, each Fetch carrying a random token the manifest brings over the mTLS control plane. Needs signed "
        "weights (replicas refuse such a version without the run's public key: integrity stays); loses the weights' "
        "confidentiality on the wire and lets anyone who sees the traffic fetch staged versions."))


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


class SecurityConfig(Section):
    """Authentication between the services, and signed weights."""

    mode: Literal["mtls", "token", "none"] = Field(
        "mtls", description="mtls: a run CA and a certificate per component, roles per RPC (rlfleet/security); "
        "token: one shared token, no roles, no TLS; none: nothing (explicit local experiments only; every service "
        "warns).")
    token_file: str | None = Field(None, description="token mode: the file holding the token (the launcher writes "
                                   "a fresh one in the run folder).")
    pki_dir: str | None = Field(None, description="mtls: ca.crt, NAME.crt, NAME.key (0600); the launcher makes "
                                "them.")
    signing_key: str | None = Field(None, description="Ed25519 private key (PEM) signing weights/checkpoints: "
                                    "trainer only.")
    signing_public_key: str | None = Field(None, description="Its public key: replicas and the trainer refuse what "
                                           "it did not sign.")
    version_lead: int = Field(1, ge=0, description="Put/Claim weight_version may lead the trainer's policy version "
                              "by this.")
    metrics_bind: str = Field("127.0.0.1", description="Where /metrics listens (the chart sets 0.0.0.0 for "
                              "Prometheus).")


class EndpointsConfig(Section):
    """host:port of each service. The launcher fills these with free loopback ports."""

    buffer: str = Field("", description="The buffer.")
    weight_sync: str = Field("", description="The weight sync service.")
    trainer: str = Field("", description="The trainer (rank 0).")
    rollout: list[str] = Field([], description="The rollout replicas.")
    trainer_data: str = Field("", description="The trainer's weight data plane (bucketed over gRPC).")
    rendezvous: str = Field("", description="torch.distributed master addr:port for trainer ranks.")


# issue 15: speed. Cores per local service (rlfleet/placement.py) and the fast paths' off-switches.
class ServicePlacement(Section):
    """One local service's (each trainer rank's, each rollout replica's) share of the cores; null: derived."""

    cores: int | None = Field(None, ge=1, description="CPUs it is pinned to (sched_setaffinity).")
    threads: int | None = Field(None, ge=1, description="Torch intra-op threads (default: its cores).")


class PlacementConfig(Section):
    """Cores per local service (rlfleet/placement.py)."""

    pin: bool = Field(True, description="Pin each service to its cores (false: threads only).")
    trainer: ServicePlacement = Field(ServicePlacement(), description="Each trainer rank.")
    rollout: ServicePlacement = Field(ServicePlacement(), description="Each rollout replica.")
    buffer: ServicePlacement = Field(ServicePlacement(), description="The buffer.")
    weight_sync: ServicePlacement = Field(ServicePlacement(), description="The weight sync service.")


class PerfConfig(Section):
    """The fast paths' off-switches."""

    single_pass: bool = Field(True, description="minibatches 1: old logprobs from the training forward.")
    skip_zero_advantage: bool = Field(True, description="Single pass with a policy-gradient loss (no KL, entropy "
                                      "bonus or critic): rows whose advantage is 0 at every token (a GRPO group "
                                      "that scored the same) skip the forward and backward. Loss and gradients are "
                                      "unchanged; policy metrics average over the rows that trained.")
    shared_prompt: bool = Field(True, description="FSDP trainer: samples with the same prompt (a group) run it "
                                "through the model once per forward (trainer/shared_prompt.py).")
    shared_prompt_max_tokens: int = Field(8192, ge=16, description="Longest row of the shared-prompt layout; a "
                                          "group that does not fit is split, each part repeating the prompt.")
    shared_prompt_unpadded: bool = Field(True, description="FSDP trainer, float32, SDPA attention: the shared-prompt "
                                         "forward runs projections and MLPs on the real tokens only, attention on "
                                         "the layout's padded grid (trainer/grid_attention.py).")
    fused_optimizer: bool = Field(True, description="Trainer: torch's fused AdamW kernel on CPU and CUDA (~3x "
                                  "faster optimizer step; rounding differs ~1e-8 from the per-tensor loop).")
    trainer_fused_norm: bool = Field(True, description="FSDP trainer, float32 compute: RMSNorm as one fused op "
                                     "(F.rms_norm; trainer/fused_norm.py), same math, rounding ~1e-7.")
    single_turn_collector: bool = Field(True, description="Rollout: the built-in single_turn runs every group on "
                                        "one collector thread, not a thread per group (same samples; "
                                        "services/rollout/single_turn_groups.py).")
    engine_fast_decode: bool = Field(True, description="torch engine: lean Llama-family packed prefill and decode "
                                     "step on fused q/k/v and gate/up weights (fast_prefill.py, fast_decode.py).")
    onednn_linear: bool = Field(True, description="CPU: the torch engine's lean step and the float32 trainer's "
                                "linears run through oneDNN (rlfleet/onednn_linear.py; ~2x MKL on AMD CPUs, "
                                "rounding ~1e-6 apart); false: torch's own ops (MKL).")
    native_attention: bool = Field(True, description="CPU with AVX-512, one engine thread: the torch engine's lean "
                                   "decode step runs attention as a C kernel built at first use with the system C "
                                   "compiler (engines/native_attention.py; ~2x torch's ops); false, or no compiler: "
                                   "torch's ops.")
    engine_compile: bool = Field(False, description="torch engine: torch.compile that step (needs a compiler; slow "
                                 "start).")


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
        if err["type"] != "extra_forbidden":
            msg = err["msg"]
        elif loc in MOVED_FIELDS:
            msg = f"moved: write {MOVED_FIELDS[loc]}"
        else:
            msg = "unknown field (check the spelling)"
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
