"""The RolloutContext a rollout function gets: generate through the engine, encode prompts, score samples."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from rlfleet.protocols import Generation, Prompt, SamplingParams
from rlfleet.rewards.scorer import RewardFailure, Scorer
from rlfleet.sample import Sample, Status
from rlfleet.services.rollout.engines.base import Abortable, Engine
from rlfleet.services.rollout.openai_api.endpoint import OpenAIEndpoint, ServesOpenAI

log = logging.getLogger(__name__)


class ServiceContext(ServesOpenAI):
    """Implements rlfleet.protocols.RolloutContext for one replica. run_seed makes per-sample seeds reproducible."""

    def __init__(self, replica_id: str, engine: Engine, tokenizer: Any, sampling: SamplingParams,
                 scorer: Scorer, run_seed: int = 0, openai: OpenAIEndpoint | None = None,
                 reward_baselines: bool = False) -> None:
        self.run_seed = run_seed
        # WantsRewardBaselines: the trainer's estimator reads a greedy baseline reward per group (ReMax)
        self.reward_baselines = reward_baselines
        self._openai = openai
        self.replica_id = replica_id
        self.engine = engine
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.scorer = scorer
        self.batched_reward = scorer.batched       # rollout functions score whole groups with score_group

    @property
    def openai(self) -> OpenAIEndpoint | None:
        """The replica's OpenAI endpoint when rollout.openai.enabled (rollout/openai_api), else None."""
        return self._openai

    @property
    def weight_version(self) -> int:
        """The weight version the engine serves now (rlfleet.protocols.ServesWeightVersion)."""
        return int(self.engine.weight_version)

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
        """Set reward and reward_parts. A reward that raises, hangs past rollout.reward_timeout or is not finite
        marks the sample FAILED with the reason (it is still put; the run goes on)."""
        return self.score_group(prompt, [sample])[0]

    def score_group(self, prompt: Prompt, samples: list[Sample]) -> list[Sample]:
        """Score samples of one prompt together (one call of a batched reward); same failure rules as score."""
        self.score_groups([(prompt, samples)])
        return samples

    def score_groups(self, groups: Sequence[tuple[Prompt, Sequence[Sample]]]) -> None:
        """score_group of each (prompt, samples), the groups scored at the same time (Scorer.score_batches: one job
        each, all started before any is waited for). FAILED and ABORTED samples are left as they are."""
        todo = [(prompt, [s for s in samples if s.status not in (Status.FAILED, Status.ABORTED)])
                for prompt, samples in groups]
        todo = [(prompt, samples) for prompt, samples in todo if samples]
        batches = [([prompt] * len(samples), [self.decode(s.response_ids) for s in samples], samples)
                   for prompt, samples in todo]
        for (_, samples), results in zip(todo, self.scorer.score_batches(batches), strict=True):
            for sample, result in zip(samples, results, strict=True):
                if isinstance(result, RewardFailure):
                    log.warning("sample %s: %s", sample.sample_id, result)
                    sample.status, sample.status_reason = Status.FAILED, str(result)
                    sample.reward, sample.reward_parts = 0.0, {}
                else:
                    sample.reward, sample.reward_parts = result


class GroupAborted(RuntimeError):
    """The work loop aborted this group (no longer wanted): its rollout function should stop."""


class GroupContext(ServesOpenAI):
    """The context one group's rollout function gets: the replica's context, recording the group's engine requests
    so the work loop can abort them (an over-sampled group no longer wanted, or the run finished) and free their
    engine slots and KV memory at once. Everything else passes through to the replica's context."""

    def __init__(self, ctx: Any, engine: Engine, group_id: str = "") -> None:
        self._ctx, self._engine, self.group_id = ctx, engine, group_id
        self._futures: list[Future[Generation]] = []
        self._lock = threading.Lock()
        self.aborted = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    @property
    def openai(self) -> OpenAIEndpoint | None:
        """The replica's OpenAI endpoint (its context's), None where it serves none."""
        return self._ctx.openai if isinstance(self._ctx, ServesOpenAI) else None

    @property
    def weight_version(self) -> int:
        """The weight version the replica's engine serves now (rlfleet.protocols.ServesWeightVersion)."""
        return int(self._engine.weight_version)

    def generate(self, input_ids: Sequence[int], sampling: SamplingParams | None = None) -> Future[Generation]:
        if self.aborted:
            raise GroupAborted("the group was aborted")
        future = self._ctx.generate(input_ids, sampling)
        with self._lock:
            self._futures = [f for f in self._futures if not f.done()] + [future]
        return future

    def abort(self) -> int:
        """Abort the group's unfinished engine requests (they resolve with finish_reason 'abort'), and those its
        sessions have in flight on the replica's OpenAI endpoint. Returns how many."""
        with self._lock:
            self.aborted = True
            pending = [f for f in self._futures if not f.done()]
        aborted = int(self._engine.abort(pending)) if pending and isinstance(self._engine, Abortable) else 0
        endpoint = self.openai
        if self.group_id and endpoint is not None:
            aborted += int(endpoint.abort_group(self.group_id))
        return aborted
