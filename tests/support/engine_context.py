"""The slice of RolloutContext a bare rollout function needs (generate on an engine), for tests and benches that
drive a WorkLoop without a tokenizer or reward. It types as a RolloutContext; what it lacks (a tokenizer, default
sampling, scoring, prompt encoding) raises if a rollout function reaches for it."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from rlfleet.protocols import Generation, Prompt, SamplingParams
from rlfleet.sample import Sample
from rlfleet.services.rollout.engines.base import Engine


class EngineContext:
    run_seed = 0
    tokenizer: Any = None
    sampling: SamplingParams                 # declared, never set: there is no default sampling here

    def __init__(self, engine: Engine, replica_id: str = "r0") -> None:
        self.engine = engine
        self.replica_id = replica_id

    def generate(self, ids: Sequence[int], sampling: SamplingParams | None = None) -> Future[Generation]:
        assert sampling is not None, "this context has no default sampling: pass SamplingParams"
        return self.engine.submit(ids, sampling)

    def score(self, prompt: Prompt, sample: Sample) -> Sample:
        raise NotImplementedError("EngineContext has no reward")

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        raise NotImplementedError("EngineContext has no tokenizer")
