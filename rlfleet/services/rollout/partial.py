"""Partial rollouts: what happens to in-flight generations when new weights arrive.

- "continue" (the engines' own behaviour): sequences keep decoding under the new weights; every token records the
  weight version that produced it (Generation.token_versions -> Sample.token_versions), and its rollout logprob is
  the producing policy's, so the trainer's per-token importance weights (TIS / icepop against rollout_logprobs) correct
  each span against the policy that really sampled it.
- "retract": the engine is paused, its running sequences are put back in its queue with their output dropped and
  their KV rows freed, the weights are loaded, and the engine resumes: those sequences are regenerated from their
  prompts, entirely under the new version. The callers' futures never see the retraction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import TypeVar

import torch

from rlfleet.protocols import Generation, SamplingParams
from rlfleet.services.rollout.engines.base import (
    Abortable,
    Engine,
    EngineError,
    EngineStats,
    HoldsAdmission,
    Pausable,
    Retractable,
    TensorThread,
    admission_held,
    on_engine_thread,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


class RetractingEngine(Pausable, Abortable, TensorThread, HoldsAdmission):
    """An Engine proxy whose weight updates retract in-flight generations first. Everything else is delegated to the
    engine it wraps: the Engine methods, and abort / call / admission_held where the engine has them (where it has
    not, what a caller does without them: abort nothing, run here, hold nothing).

    Not Streaming: a retraction drops tokens already chosen, so they cannot have been streamed to anyone (callers such
    as the OpenAI endpoint fall back to sending a completion once it is finished)."""

    def __init__(self, engine: Engine) -> None:
        if not isinstance(engine, Retractable):
            raise EngineError(f"engine {engine.name!r} cannot retract in-flight generations "
                              "(rollout.partial_rollouts: retract); use 'continue'")
        self._engine: Engine = engine
        self._retractable: Retractable = engine
        self.name = engine.name
        self.retracted = 0                   # generations retracted since start

    @property
    def weight_version(self) -> int:
        return self._engine.weight_version

    def submit(self, input_ids: Sequence[int], sampling: SamplingParams) -> Future[Generation]:
        return self._engine.submit(input_ids, sampling)

    def update_weights_from_tensor(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        self._retract_then(lambda: self._engine.update_weights_from_tensor(named_tensors, version), version)

    def update_weights_from_disk(self, path: str, version: int) -> None:
        self._retract_then(lambda: self._engine.update_weights_from_disk(path, version), version)

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        return self._engine.named_weights()

    def tied_aliases(self) -> dict[str, str] | None:
        return self._engine.tied_aliases()

    def pause(self) -> int:
        return self._engine.pause()

    @property
    def paused(self) -> bool:
        return self._engine.paused

    def resume(self) -> None:
        self._engine.resume()

    def abort_in_flight(self) -> int:
        return self._engine.abort_in_flight()

    def abort(self, futures: Iterable[Future[Generation]]) -> int:
        return self._engine.abort(futures) if isinstance(self._engine, Abortable) else 0

    def call(self, fn: Callable[[], T]) -> T:
        return on_engine_thread(self._engine, fn)

    def admission_held(self) -> AbstractContextManager[None]:
        return admission_held(self._engine)

    def stats(self) -> EngineStats:
        return self._engine.stats()

    def healthy(self) -> bool:
        return self._engine.healthy()

    def shutdown(self) -> None:
        self._engine.shutdown()

    def _retract_then(self, update: Callable[[], None], version: int) -> None:
        was_paused = self._engine.paused
        self._engine.pause()
        try:
            n = self._retractable.retract_in_flight()
            self.retracted += n
            update()
            if n:
                log.info("weight version %d: %d in-flight generations retracted, regenerating", version, n)
        finally:
            if not was_paused:
                self._engine.resume()


def with_partial_rollouts(engine: Engine, mode: str) -> Engine:
    """The engine to serve with for rollout.partial_rollouts = mode ("continue" | "retract")."""
    if mode == "retract":
        return RetractingEngine(engine)
    if mode != "continue":
        raise ValueError(f"rollout.partial_rollouts is {mode!r}, not 'continue' or 'retract'")
    return engine
