"""The rollout section: sampling, the engine (built-in torch or SGLang) and its health checks, the dataset by path, the
OpenAI-compatible endpoint."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rlfleet.config.section import Section


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
                                                 "computed from: the weights read back from the server (as JSON: "
                                                 "~360 CPU s per GB of bf16 weights, and only with tp 1; "
                                                 "docs/cluster.md), or those sent.")
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
                                     "(0600); default RUN_DIR/pki/openai-api.key, made by rlfleet run. It may list "
                                     "several keys, one a line (one per tenant: a session is bound to the key that "
                                     "opened it; rollout functions use the first). token mode: the run token; none: "
                                     "no key")
    max_sessions: int = Field(4096, ge=1, description="TITO sessions held at once; the least recently used "
                              "beyond this are dropped")
    request_timeout: float = Field(600.0, gt=0, description="seconds a completion may take before it fails (504)")
    max_connections: int = Field(256, ge=1, description="connections each endpoint (and the gateway) serves at "
                                 "once, a thread each; more are refused at accept (503). Idle or half-sent "
                                 "requests are dropped after 30 s")
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
