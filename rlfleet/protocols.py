"""Plugin contracts. User code implements these and is named in the config by dotted path.

Every contract is a Protocol or a frozen dataclass. A plugin is checked at start-up against its Protocol's own
`__call__` (rlfleet.plugins reads the signature from here: these Protocols are the single source of truth).
Tensor shapes: S = samples in a batch, T = response tokens (padded), G = groups.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from rlfleet.sample import Sample


@dataclass(frozen=True)
class Prompt:
    """One item of a data source. Give text, chat messages, or token ids (ids win)."""

    index: int
    text: str | None = None
    messages: tuple[Mapping[str, str], ...] | None = None
    token_ids: tuple[int, ...] | None = None
    label: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    extras: Mapping[str, Any] = field(default_factory=dict)   # a dataset's other columns: reward keyword arguments


@runtime_checkable
class DataSource(Protocol):
    """Deterministic, indexable prompts. Index i may exceed len(): sources wrap (epochs)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Prompt: ...


class DataSourceFactory(Protocol):
    def __call__(self, **kwargs: Any) -> DataSource: ...


class RewardFn(Protocol):
    """Score one finished sample. Return a float, or named parts (their sum, or the part 'total').

    Further required parameters of an implementation are the dataset's other columns, passed by keyword."""

    def __call__(self, prompt: Prompt, completion: str, sample: Sample) -> float | Mapping[str, float]: ...


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class Generation:
    """What an engine returns for one request: exact token ids and their logprobs (TITO)."""

    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str                       # "stop" | "length" | "abort"
    weight_version: int
    routed_experts: Any | None = None        # np.ndarray [T, layers, top_k] for MoE models
    token_versions: tuple[int, ...] = ()     # [T] weight version that produced each token (partial rollouts)


class GenerateFn(Protocol):
    def __call__(self, input_ids: Sequence[int], sampling: SamplingParams) -> Future[Generation]: ...


class RolloutContext(Protocol):
    """What a rollout function may use. Provided by the rollout service."""

    replica_id: str
    tokenizer: Any
    sampling: SamplingParams
    run_seed: int                            # the run's seed: derive per-sample seeds from it (reproducible)

    def generate(self, input_ids: Sequence[int], sampling: SamplingParams | None = None) -> Future[Generation]: ...

    def score(self, prompt: Prompt, sample: Sample) -> Sample: ...

    def encode_prompt(self, prompt: Prompt) -> list[int]: ...


@runtime_checkable
class ScoresGroups(Protocol):
    """Optional for a RolloutContext: scores several finished samples of one group in one call (one hand-off to the
    reward's thread), and says whether the reward is batched (it must see the whole group at once). The rollout
    service's contexts declare it; a context without it is scored one sample at a time."""

    batched_reward: bool

    def score_group(self, prompt: Prompt, samples: list[Sample]) -> list[Sample]: ...


@runtime_checkable
class ServesWeightVersion(Protocol):
    """Optional for a RolloutContext: the weight version (and its epoch) the replica serves now, for a rollout
    function that makes samples without generating (the data replica's `labelled`,
    rlfleet/services/rollout/labelled.py): its samples carry it through the buffer's staleness gate like generated
    ones. The rollout service's contexts declare it."""

    @property
    def weight_version(self) -> int: ...


@runtime_checkable
class SuppliesRewardBaselines(Protocol):
    """Optional capability of a RolloutFn: `supplies_reward_baselines = True` says that, when its context asks for
    them (WantsRewardBaselines), it sets on every sample of a group the reward of one greedy (temperature 0) response
    to the prompt, scored by the same reward and not put (Sample.reward_baseline: ReMax's baseline). `rlfleet check`
    refuses an estimator that needs them (AdvantageSpec.needs_reward_baseline) with a rollout function without it."""

    supplies_reward_baselines: bool


@runtime_checkable
class WantsRewardBaselines(Protocol):
    """Optional for a RolloutContext: `reward_baselines = True` when the trainer's estimator reads a greedy baseline
    reward per group (the rollout service's contexts declare it, from AdvantageSpec.needs_reward_baseline)."""

    reward_baselines: bool


@runtime_checkable
class ReadsLabels(Protocol):
    """Optional capability of a RolloutFn: `needs_labels = True` says every data row must hold a supervised target
    (rlfleet/data/labels.py), so `rlfleet run` checks the data for one before anything starts."""

    needs_labels: bool


@dataclass(frozen=True)
class GroupTicket:
    group_id: str
    prompt_index: int
    group_size: int


class RolloutFn(Protocol):
    """Produce the group's samples, yielding each the moment it is finished and scored."""

    def __call__(self, ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket) -> Iterator[Sample]: ...


class SampleFilter(Protocol):
    """Look at one complete group. Return None to keep it, or the reason it is dropped."""

    def __call__(self, group: Sequence[Sample]) -> str | None: ...


@dataclass
class TrainBatch:
    """A batch of samples as padded tensors. Row order follows the buffer's batch.

    tokens: [S, P+T] prompt and response ids, right-padded; response positions are
    response_start[s] .. response_start[s]+T_s-1.
    """

    input_ids: torch.Tensor          # [S, L] int64
    attention_mask: torch.Tensor     # [S, L] int64
    response_mask: torch.Tensor      # [S, T] float32, loss mask (0 on padding and tool tokens)
    response_start: torch.Tensor     # [S] int64: index in input_ids of the first response token
    rollout_logprobs: torch.Tensor   # [S, T] float32
    rewards: torch.Tensor            # [S] float32
    group_index: torch.Tensor        # [S] int64: which group each row belongs to, 0..G-1
    weight_versions: torch.Tensor    # [S] int64
    sample_ids: list[str]
    old_logprobs: torch.Tensor | None = None      # [S, T] from the trainer's no-grad forward
    ref_logprobs: torch.Tensor | None = None      # [S, T] reference model, when a KL term is used
    teacher_logprobs: torch.Tensor | None = None  # [S, T] on-policy distillation
    values: torch.Tensor | None = None            # [S, T] critic values (PPO)
    extras: dict[str, Any] = field(default_factory=dict)


class AdvantageEstimator(Protocol):
    """advantages: [S, T], zero where response_mask is zero."""

    def __call__(self, batch: TrainBatch) -> torch.Tensor: ...


@dataclass(frozen=True)
class LossOutput:
    loss: torch.Tensor               # scalar, already aggregated the way the loss wants
    metrics: Mapping[str, float]


class LossFn(Protocol):
    """logprobs: [S, T] under the current policy (with grad); advantages: [S, T]."""

    def __call__(self, logprobs: torch.Tensor, advantages: torch.Tensor, batch: TrainBatch,
                  token_count: float) -> LossOutput: ...


@runtime_checkable
class ZeroAtZeroAdvantage(Protocol):
    """Optional capability of a LossFn: it declares whether a token whose advantage is 0 adds 0 to the loss and to
    its gradient, whatever its logprob (then the trainer may leave rows with a zero advantage at every token out of
    the forward: rlfleet/services/trainer/step.py). A loss that does not declare it is treated as False."""

    @property
    def zero_at_zero_advantage(self) -> bool: ...


class TrainerHooks(Protocol):
    """Optional hooks; implement any subset. Named by dotted path to a class or factory."""

    def after_model_init(self, model: torch.nn.Module) -> None: ...

    def before_logprobs(self, batch: TrainBatch) -> None: ...

    def before_step(self, step: int, batch: TrainBatch) -> None: ...

    def after_save(self, step: int, path: str) -> None: ...


HOOK_NAMES: tuple[str, ...] = tuple(name for name, value in vars(TrainerHooks).items()
                                    if not name.startswith("_") and callable(value))


@runtime_checkable
class NeedsOldLogprobs(Protocol):
    """Optional capability of a TrainerHooks object: `needs_old_logprobs = True` says the hook must see the old
    logprobs before the training forward (so the trainer runs the separate no-grad forward even when one optimizer
    step per batch would let it reuse the training forward's). A hook that does not declare it is treated as False."""

    needs_old_logprobs: bool


class ModuleReplacement(Protocol):
    """model.specs: a torch.nn.Module class that replaces the module at a dotted path of the policy model (a custom
    attention, an MLP, a router), in the trainer and the torch engine alike (rlfleet/model_specs/).

    `from_module` builds the replacement from the module it replaces (`path` is its dotted name in the model), taking
    over its parameters and buffers: the replacement's state dict must hold the same names and shapes as the
    original's, because checkpoints, weight publishing and the engine's weight loads go by name. Its forward is called
    the way the original's is (same arguments, same outputs)."""

    @classmethod
    def from_module(cls, original: torch.nn.Module, path: str) -> torch.nn.Module: ...


class RouterScoreFn(Protocol):
    """model.router_scores: how an MoE router class turns its logits into the top-k weights of given experts, for R3
    routing replay (rlfleet/services/trainer/routing_replay.py). logits: [N, E]; ids: [N, K] -> weights [N, K]."""

    def __call__(self, router: torch.nn.Module, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor: ...


class ModelPrepareFn(Protocol):
    """model.prepare: build the Hugging Face model folder model_dir (config.json, safetensors) at start-up."""

    def __call__(self, model_dir: str, seed: int) -> None: ...


def reward_total(value: float | Mapping[str, float]) -> tuple[float, dict[str, float]]:
    """Fold a reward function's result into (scalar reward, parts)."""
    if isinstance(value, Mapping):
        parts = {str(k): float(v) for k, v in value.items()}
        return (parts["total"] if "total" in parts else sum(parts.values())), parts
    return float(value), {}


def iter_samples(result: Iterable[Sample] | Sample) -> Iterable[Sample]:
    from rlfleet.sample import Sample

    return [result] if isinstance(result, Sample) else result
