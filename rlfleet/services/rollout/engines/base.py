"""The engine contract of a rollout replica, shaped after SGLang's engine API so SGLang drops in beside torch.

SGLang mapping: submit -> /generate (input_ids, sampling params, return_logprob); update_weights_from_tensor /
update_weights_from_disk -> the calls of the same name inside begin/end_weight_update; pause/resume ->
pause_generation / continue_generation; named_weights -> what the replica holds, for the manifest digest.
An SGLang engine would add update_weights_from_distributed (a collective group with the trainer) as a transport
beside these; the torch engine receives tensors through rlfleet.services.weight_sync.transports and loads them from
memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from rlfleet.protocols import Generation, SamplingParams

if TYPE_CHECKING:
    import torch

    from rlfleet.runtime.torch_profile import VersionProfiler

T = TypeVar("T")


class EngineError(RuntimeError):
    """An engine that cannot load a model, or a request or weight update it refuses."""


def check_request(input_ids: Sequence[int], sampling: SamplingParams) -> None:
    """The checks every engine's submit makes before a request can enter a batch; EngineError otherwise."""
    if not input_ids:
        raise EngineError("empty prompt")
    if sampling.max_new_tokens < 1:
        raise EngineError(f"max_new_tokens is {sampling.max_new_tokens}, must be >= 1")


@dataclass(frozen=True)
class EngineStats:
    running: int              # sequences in the batch now
    waiting: int              # submitted, not yet admitted
    generated_tokens: int     # output tokens since start
    finished: int             # requests resolved since start


class WeightLoadTarget(Protocol):
    """What loading a weight version needs of an engine (rollout/weight_updates.py, engines/lora.py): the version it
    serves, the tensors it holds, its own tied aliases, and the swap. Every Engine is one."""

    @property
    def weight_version(self) -> int: ...

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]: ...

    def update_weights_from_tensor(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None: ...

    def tied_aliases(self) -> dict[str, str] | None:
        """alias -> source for the tensors it holds under two names (rlfleet/weights/tied.py), or None when it cannot
        tell
        (a server engine: taken to tie what the trainer ties)."""
        ...


@runtime_checkable
class TensorThread(Protocol):
    """An engine whose own thread does all tensor work on its model (the torch engine; see its module doc for why):
    other threads hand it such work with `call`, which runs fn there between two steps and returns its result."""

    def call(self, fn: Callable[[], T]) -> T: ...


def on_engine_thread(engine: object, fn: Callable[[], T]) -> T:
    """fn() on the engine's tensor thread when it has one (TensorThread), else here."""
    return engine.call(fn) if isinstance(engine, TensorThread) else fn()


@runtime_checkable
class ProfilesDecode(Protocol):
    """An engine that traces its own steps with torch.profiler (trainer.profile; the torch engine): the profiler's
    before_step/close are called on the engine's thread (rlfleet/runtime/torch_profile.py VersionProfiler)."""

    def profile_decode(self, profiler: VersionProfiler) -> None: ...


@runtime_checkable
class Pausable(Protocol):
    """An engine that can hold decoding while weights load (both real engines). A weight target that is not one (a
    test double, a bench's dict of tensors) is loaded unpaused."""

    @property
    def paused(self) -> bool: ...

    def pause(self) -> int: ...

    def resume(self) -> None: ...

    def abort_in_flight(self) -> int: ...


@runtime_checkable
class HoldsAdmission(Protocol):
    """An engine that can hold back new requests while a burst is submitted (the torch engine): the requests
    submitted inside `admission_held()` start together, in one prefill, when the outermost hold ends."""

    def admission_held(self) -> AbstractContextManager[None]: ...


def admission_held(engine: object) -> AbstractContextManager[None]:
    """engine.admission_held() where the engine has it (HoldsAdmission), else a hold that does nothing."""
    return engine.admission_held() if isinstance(engine, HoldsAdmission) else nullcontext()


@runtime_checkable
class Abortable(Protocol):
    """An engine that can abort chosen requests (the torch engine): they resolve now with finish_reason 'abort' and
    free their batch slots and KV rows. Without it, a request no longer wanted runs to its end."""

    def abort(self, futures: Iterable[Future[Generation]]) -> int:
        """Abort these requests; returns how many were still in the engine."""
        ...


@runtime_checkable
class Streaming(Protocol):
    """An engine that reports each output token the moment it is chosen (the torch engine): what the OpenAI
    endpoint streams. Without it, a stream request is answered once its completion is finished."""

    def submit_streaming(self, input_ids: Sequence[int], sampling: SamplingParams,
                         on_token: Callable[[int, float], None] | None) -> Future[Generation]:
        """submit, calling on_token(id, logprob) as each output token is chosen."""
        ...


@runtime_checkable
class Retractable(Protocol):
    """An engine that can put its running requests back in its queue, output dropped, to be generated again (the
    torch engine): what rollout.partial_rollouts 'retract' needs."""

    def retract_in_flight(self) -> int:
        """Retract every running request (futures stay pending); call while paused. Returns how many."""
        ...


@runtime_checkable
class Engine(Protocol):
    """One inference engine replica. Thread-safe: submit and the weight calls may come from any thread."""

    name: str

    @property
    def weight_version(self) -> int: ...

    def submit(self, input_ids: Sequence[int], sampling: SamplingParams) -> Future[Generation]:
        """Queue one request; the future resolves the moment that request finishes (stop, length or abort)."""
        ...

    def update_weights_from_tensor(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Swap weights between two decode steps (in-flight sequences continue under the new weights)."""
        ...

    def update_weights_from_disk(self, path: str, version: int) -> None: ...

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """What the engine holds now, by parameter name (state-dict names)."""
        ...

    def tied_aliases(self) -> dict[str, str] | None: ...

    def pause(self) -> int:
        """Stop scheduling decode steps after the current one; returns the number of in-flight requests."""
        ...

    @property
    def paused(self) -> bool: ...

    def resume(self) -> None: ...

    def abort_in_flight(self) -> int:
        """Resolve every running and waiting request now with finish_reason 'abort'; returns how many."""
        ...

    def stats(self) -> EngineStats: ...

    def healthy(self) -> bool:
        """True while the engine can serve requests: its decode loop runs, or its server answers /health."""
        ...

    def shutdown(self) -> None: ...
