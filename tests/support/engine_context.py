"""The slice of RolloutContext a bare rollout function needs (generate on an engine), for tests and benches that
drive a WorkLoop without a tokenizer or reward."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future

from rlfleet.protocols import Generation, SamplingParams
from services.rollout.engines.base import Engine


class EngineContext:
    run_seed = 0

    def __init__(self, engine: Engine, replica_id: str = "r0") -> None:
        self.engine = engine
        self.replica_id = replica_id

    def generate(self, ids: Sequence[int], sampling: SamplingParams | None = None) -> Future[Generation]:
        assert sampling is not None, "this context has no default sampling: pass SamplingParams"
        return self.engine.submit(ids, sampling)
