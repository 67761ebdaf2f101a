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
from typing import Any

import torch

from rlfleet.services.rollout.engines.base import Engine, EngineError

log = logging.getLogger(__name__)


class RetractingEngine:
    """An Engine proxy whose weight updates retract in-flight generations first. Everything else passes through."""

    def __init__(self, engine: Engine) -> None:
        if not hasattr(engine, "retract_in_flight"):
            raise EngineError(f"engine {engine.name!r} cannot retract in-flight generations "
                              "(rollout.partial_rollouts: retract); use 'continue'")
        self._engine = engine
        self.retracted = 0                   # generations retracted since start

    # A retraction drops tokens already chosen, so they cannot have been streamed to anyone: no streaming submit
    # (callers such as the OpenAI endpoint fall back to sending a completion once it is finished).
    submit_streaming = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    @property
    def weight_version(self) -> int:
        return self._engine.weight_version

    def update_weights_from_tensor(self, named_tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        self._retract_then(lambda: self._engine.update_weights_from_tensor(named_tensors, version), version)

    def update_weights_from_disk(self, path: str, version: int) -> None:
        self._retract_then(lambda: self._engine.update_weights_from_disk(path, version), version)

    def _retract_then(self, update: Any, version: int) -> None:
        was_paused = bool(getattr(self._engine, "paused", False))
        self._engine.pause()
        try:
            n = self._engine.retract_in_flight()
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
