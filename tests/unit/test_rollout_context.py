"""Rollout context and the single_turn rollout function: scoring, failing rewards, sample fields."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from rlfleet.protocols import GroupTicket, Prompt, SamplingParams
from rlfleet.rewards.scorer import Scorer, batched
from rlfleet.sample import Sample, Status
from rlfleet.services.rollout.context import ServiceContext
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.rollout.rollout_fns import single_turn

torch.set_num_threads(1)


def make_ctx(tiny_engine: TorchEngine, tiny_model_dir: Path, reward_fn, temperature: float = 1.0) -> ServiceContext:
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    return ServiceContext("r0", tiny_engine, tok, SamplingParams(temperature=temperature, max_new_tokens=6),
                          Scorer(reward_fn, 30.0),
                          run_seed=7)


def length_reward(prompt: Prompt, completion: str, sample: Sample) -> dict[str, float]:
    return {"length": float(len(sample.response_ids)), "bonus": 1.0}


def exploding_reward(prompt: Prompt, completion: str, sample: Sample) -> float:
    raise ValueError("no label for this prompt")


def test_single_turn_yields_scored_samples(tiny_engine: TorchEngine, tiny_model_dir: Path) -> None:
    ctx = make_ctx(tiny_engine, tiny_model_dir, length_reward)
    prompt = Prompt(index=5, text="12+34=")
    samples = list(single_turn(ctx, prompt, GroupTicket(group_id="g1", prompt_index=5, group_size=4)))
    assert sorted(s.index for s in samples) == [0, 1, 2, 3]
    for s in samples:
        s.validate()
        assert s.prompt_ids == ctx.encode_prompt(prompt) == ctx.tokenizer.encode("12+34=")
        assert s.status in (Status.COMPLETED, Status.TRUNCATED) and s.replica_id == "r0" and s.prompt_index == 5
        assert len(s.rollout_logprobs) == len(s.response_ids) > 0
        assert s.reward == len(s.response_ids) + 1.0 and s.reward_parts["bonus"] == 1.0
    again = {s.index: s.response_ids for s in single_turn(ctx, prompt, GroupTicket("g1", 5, 4))}
    assert again == {s.index: s.response_ids for s in samples}      # per-sample seeds: reproducible


def test_reward_that_raises_fails_the_sample_not_the_replica(tiny_engine: TorchEngine, tiny_model_dir: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    ctx = make_ctx(tiny_engine, tiny_model_dir, exploding_reward)
    with caplog.at_level(logging.WARNING):
        samples = list(single_turn(ctx, Prompt(index=0, token_ids=(1, 5, 6)), GroupTicket("g2", 0, 2)))
    assert len(samples) == 2
    for s in samples:
        assert s.status == Status.FAILED
        assert s.status_reason == "reward_fn raised ValueError: no label for this prompt"
        assert s.response_ids and s.prompt_ids == [1, 5, 6]
        s.validate()                                                # still a valid sample to put
    assert "reward_fn raised ValueError" in caplog.text


def test_non_finite_reward_fails_the_sample(tiny_engine: TorchEngine, tiny_model_dir: Path) -> None:
    ctx = make_ctx(tiny_engine, tiny_model_dir, lambda p, c, s: float("nan"), temperature=0)
    sample = next(iter(single_turn(ctx, Prompt(index=0, token_ids=(1, 5)), GroupTicket("g3", 0, 1))))
    assert sample.status == Status.FAILED and "not finite" in sample.status_reason


def test_batched_reward_scores_the_group_once_with_columns(tiny_engine: TorchEngine, tiny_model_dir: Path) -> None:
    calls: list[tuple[int, list[int]]] = []

    @batched
    def by_group(prompts: list[Prompt], completions: list[str], samples: list[Sample], level: list[int]) -> list:
        calls.append((len(samples), level))
        return [float(len(s.response_ids)) * lv for s, lv in zip(samples, level, strict=True)]

    ctx = make_ctx(tiny_engine, tiny_model_dir, by_group)
    prompt = Prompt(index=1, text="12+34=", extras={"level": 2, "ignored": "x"})
    samples = list(single_turn(ctx, prompt, GroupTicket("g4", 1, 3)))
    assert calls == [(3, [2, 2, 2])]
    assert sorted(s.index for s in samples) == [0, 1, 2]
    assert all(s.reward == 2.0 * len(s.response_ids) and s.status != Status.FAILED for s in samples)


def test_hanging_reward_fails_the_sample_with_the_reason(tiny_engine: TorchEngine, tiny_model_dir: Path) -> None:
    def hang(prompt: Prompt, completion: str, sample: Sample) -> float:
        time.sleep(60)
        return 1.0

    ctx = make_ctx(tiny_engine, tiny_model_dir, hang)
    ctx.scorer = Scorer(hang, 0.2)
    t0 = time.monotonic()
    samples = list(single_turn(ctx, Prompt(index=0, token_ids=(1, 5)), GroupTicket("g5", 0, 2)))
    assert time.monotonic() - t0 < 10
    assert [s.status for s in samples] == [Status.FAILED, Status.FAILED]
    assert all(s.status_reason == "reward_fn timed out after 0.2s" and s.reward == 0.0 for s in samples)
