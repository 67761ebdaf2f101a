"""Partial rollouts on the torch engine: continue in place (per-token versions) vs retract (regenerated under the new
weights); aborting over-sampled requests frees their batch slots and KV rows."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch

from rlfleet.protocols import Generation, GroupTicket, Prompt, SamplingParams
from rlfleet.sample import Sample, Status
from rlfleet.services.rollout.engines.base import Engine
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.rollout.partial import RetractingEngine
from rlfleet.services.rollout.rollout_fns import single_turn
from rlfleet.services.trainer.batch import build_train_batch
from rlfleet.services.trainer.token_versions import (
    TOKEN_VERSIONS,
    token_versions_tensor,
    version_metrics,
    version_sums,
    version_totals,
)
from tests.support.tiny_model import make_tiny_model

torch.set_num_threads(1)
PROMPT = [1, 4, 5, 6]
LONG = SamplingParams(temperature=1.0, max_new_tokens=32, seed=7, stop_token_ids=())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def _engine(model_dir: Path) -> TorchEngine:
    return TorchEngine(model_dir, max_batch_size=8, eos_token_ids=())      # no EOS: every request runs to length


def _new_weights(engine: TorchEngine) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(n, t + 0.05 * torch.randn(t.shape, generator=g)) for n, t in engine.named_weights()]


def _wait_tokens(engine: Engine, n: int) -> None:
    deadline = time.monotonic() + 30
    while engine.stats().generated_tokens < n:
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_continue_in_place_records_the_version_of_every_token(model_dir: Path) -> None:
    engine = _engine(model_dir)
    try:
        new = _new_weights(engine)                      # prepared first: the update must land mid-sequence
        engine.pause()
        future = engine.submit(PROMPT, LONG)
        engine.resume()
        _wait_tokens(engine, 3)
        engine.pause()                                  # hold the sequence between two decode steps
        engine.update_weights_from_tensor(new, version=1)
        engine.resume()
        gen = future.result(timeout=60)
    finally:
        engine.shutdown()
    versions = list(gen.token_versions)
    assert versions[0] == 0 and versions[-1] == 1 and versions == sorted(versions)
    assert gen.weight_version == 0                         # the oldest version: the buffer's staleness gate is safe


def test_retract_regenerates_under_the_new_weights(model_dir: Path) -> None:
    fresh = _engine(model_dir)
    weights = _new_weights(fresh)
    fresh.update_weights_from_tensor(weights, version=1)
    expected = fresh.submit(PROMPT, LONG).result(timeout=60)
    fresh.shutdown()

    engine = RetractingEngine(_engine(model_dir))
    try:
        future = engine.submit(PROMPT, LONG)
        _wait_tokens(engine, 3)
        engine.update_weights_from_tensor(weights, version=1)
        gen = future.result(timeout=60)
    finally:
        engine.shutdown()
    assert engine.retracted == 1 and not engine.paused
    assert set(gen.token_versions) == {1} and gen.weight_version == 1
    assert gen.output_ids == expected.output_ids          # same seed, same weights: the same tokens
    assert gen.logprobs == pytest.approx(expected.logprobs, abs=1e-5)


def test_abort_frees_slots_and_kv_rows(model_dir: Path) -> None:
    engine = _engine(model_dir)
    try:
        futures = [engine.submit([1, 4 + i, 5], LONG) for i in range(6)]
        _wait_tokens(engine, 12)
        engine.pause()                                  # hold every sequence between two decode steps
        assert engine.kv_tokens() > 0
        assert engine.abort(futures[::2]) == 3
        engine.resume()
        kept = [f.result(timeout=60) for f in futures[1::2]]
        aborted = [f.result(timeout=1) for f in futures[::2]]
        deadline = time.monotonic() + 5
        while engine.stats().running and time.monotonic() < deadline:
            time.sleep(0.01)
        stats = engine.stats()
    finally:
        engine.shutdown()
    assert all(g.finish_reason == "length" and len(g.output_ids) == LONG.max_new_tokens for g in kept)
    assert all(g.finish_reason == "abort" and len(g.output_ids) < LONG.max_new_tokens for g in aborted)
    assert stats.running == 0 and stats.waiting == 0 and engine.kv_tokens() == 0


def test_token_versions_reach_the_train_batch_and_its_metrics(model_dir: Path) -> None:
    engine = _engine(model_dir)

    class Ctx:
        replica_id, tokenizer, run_seed = "r0", None, 0
        sampling = LONG

        def generate(self, ids: Sequence[int], sampling: SamplingParams | None = None) -> Future[Generation]:
            return engine.submit(ids, sampling or LONG)

        def encode_prompt(self, prompt: Prompt) -> list[int]:
            return list(prompt.token_ids or ())

        def score(self, prompt: Prompt, sample: Sample) -> Sample:
            sample.reward = 1.0
            return sample

    samples: list[Sample] = []
    try:
        engine.pause()
        run = single_turn(Ctx(), Prompt(index=0, token_ids=tuple(PROMPT)), GroupTicket("g0", 0, 2))
        consumer = threading.Thread(target=lambda: samples.extend(run))
        consumer.start()                                    # submits both requests; the engine is paused
        while engine.stats().waiting < 2:
            time.sleep(0.001)
        new = _new_weights(engine)
        engine.resume()
        _wait_tokens(engine, 4)
        engine.pause()                                  # hold both sequences between two decode steps
        engine.update_weights_from_tensor(new, version=1)
        engine.resume()
        consumer.join(timeout=60)
    finally:
        engine.shutdown()
    assert all(s.status == Status.TRUNCATED for s in samples)
    mixed = [s for s in samples if s.token_versions]
    assert len(samples) == 2 and mixed, "the update landed mid-sequence: tokens of versions 0 and 1"
    batch = build_train_batch(samples)
    versions = batch.extras[TOKEN_VERSIONS]                                             # [S, T]
    assert torch.equal(versions, token_versions_tensor(samples, batch.response_mask.shape[1]))
    assert versions.shape == batch.response_mask.shape
    m = version_metrics(batch, policy_version=1)
    totals = version_totals(version_sums(batch))                                        # what the trainer logs
    assert totals["mixed_version_samples"] == m["mixed_version_samples"]
    assert 0 < totals["token_version_mean"] < 1
    assert m["token_version_min"] == 0 and m["token_version_max"] == 1 and 0 < m["token_version_lag_mean"] < 1
    assert m["mixed_version_samples"] == len(mixed) / len(samples)
