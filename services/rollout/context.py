"""The RolloutContext a rollout function gets: generate through the engine, encode prompts, score samples."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from rlfleet.protocols import Generation, Prompt, RewardFn, SamplingParams, reward_total
from rlfleet.sample import Sample, Status
from services.rollout.engines.base import Engine

log = logging.getLogger(__name__)


class ServiceContext:
    """Implements rlfleet.protocols.RolloutContext for one replica. run_seed makes per-sample seeds reproducible."""

    def __init__(self, replica_id: str, engine: Engine, tokenizer: Any, sampling: SamplingParams,
                 reward_fn: RewardFn, run_seed: int = 0) -> None:
        self.run_seed = run_seed
        self.replica_id = replica_id
        self.engine = engine
        self.tokenizer = tokenizer
        self.sampling = sampling
        self._reward_fn = reward_fn

    def generate(self, input_ids: Sequence[int], sampling: SamplingParams | None = None) -> Future[Generation]:
        return self.engine.submit(input_ids, sampling or self.sampling)

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        if prompt.token_ids is not None:
            return [int(t) for t in prompt.token_ids]
        if prompt.messages is not None:
            ids = self.tokenizer.apply_chat_template([dict(m) for m in prompt.messages], tokenize=True,
                                                     add_generation_prompt=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):       # BatchEncoding in newer transformers
                ids = ids["input_ids"]
            return [int(t) for t in ids]
        if prompt.text is not None:
            return [int(t) for t in self.tokenizer.encode(prompt.text)]
        raise ValueError(f"prompt {prompt.index} has no token_ids, messages or text")

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def score(self, prompt: Prompt, sample: Sample) -> Sample:
        """Set reward and reward_parts. A reward function that raises marks the sample FAILED (it is still put)."""
        if sample.status in (Status.FAILED, Status.ABORTED):
            return sample
        try:
            value = self._reward_fn(prompt, self.decode(sample.response_ids), sample)
            reward, parts = reward_total(value)
            if not math.isfinite(reward) or not all(math.isfinite(v) for v in parts.values()):
                raise ValueError(f"reward is not finite: {value!r}")
        except Exception as exc:  # noqa: BLE001 - user code: any failure fails the sample, never the replica
            reason = f"reward_fn raised {type(exc).__name__}: {exc}"
            log.warning("sample %s: %s", sample.sample_id, reason)
            sample.status, sample.status_reason = Status.FAILED, reason
            sample.reward, sample.reward_parts = 0.0, {}
            return sample
        sample.reward, sample.reward_parts = reward, parts
        return sample


class GroupAborted(RuntimeError):
    """The work loop aborted this group (no longer wanted): its rollout function should stop."""


class GroupContext:
    """The context one group's rollout function gets: the replica's context, recording the group's engine requests
    so the work loop can abort them (an over-sampled group no longer wanted, or the run finished) and free their
    engine slots and KV memory at once. Everything else passes through to the replica's context."""

    def __init__(self, ctx: Any, engine: Engine) -> None:
        self._ctx, self._engine = ctx, engine
        self._futures: list[Future[Generation]] = []
        self._lock = threading.Lock()
        self.aborted = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def generate(self, input_ids: Sequence[int], sampling: SamplingParams | None = None) -> Future[Generation]:
        if self.aborted:
            raise GroupAborted("the group was aborted")
        future = self._ctx.generate(input_ids, sampling)
        with self._lock:
            self._futures = [f for f in self._futures if not f.done()] + [future]
        return future

    def abort(self) -> int:
        """Abort the group's unfinished engine requests (they resolve with finish_reason 'abort'). Returns how many."""
        with self._lock:
            self.aborted = True
            pending = [f for f in self._futures if not f.done()]
        abort = getattr(self._engine, "abort", None)
        return int(abort(pending)) if pending and abort is not None else 0
