"""first_invalid: validate_message over many samples at once refuses exactly what it refuses, naming the first bad
sample with validate_message's words; a good batch passes."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from rlfleet.sample.batch_check import first_invalid
from rlfleet.sample.limits import SampleLimits
from rlfleet.v1 import sample_pb2

LIMITS = SampleLimits(vocab_size=100, max_weight_version=3)


def good(index: int, tokens: int = 3) -> sample_pb2.Sample:
    return sample_pb2.Sample(group_id="g1", index=index, group_size=4, prompt_ids=np.array([1, 2], "<i4").tobytes(),
                             response_ids=np.arange(tokens, dtype="<i4").tobytes(),
                             loss_mask=np.ones(tokens, "u1").tobytes(),
                             rollout_logprobs=np.full(tokens, -0.5, "<f4").tobytes(), weight_version=2,
                             status=sample_pb2.SAMPLE_STATUS_COMPLETED)


def f32(*v: float) -> bytes:
    return np.array(v, "<f4").tobytes()


def i32(*v: int) -> bytes:
    return np.array(v, "<i4").tobytes()


BREAKAGES: dict[str, tuple[Callable[[sample_pb2.Sample], None], str]] = {
    "negative id": (lambda m: setattr(m, "prompt_ids", i32(1, -4)), "prompt_ids holds a negative token id (-4)"),
    "outside vocab": (lambda m: setattr(m, "response_ids", i32(1, 100, 2)), "token id 100, outside the vocabulary"),
    "mask 2": (lambda m: setattr(m, "loss_mask", bytes([1, 2, 1])), "loss_mask holds 2"),
    "nan logprob": (lambda m: setattr(m, "rollout_logprobs", f32(-1, float("nan"), -1)), "contain NaN or inf"),
    "positive logprob": (lambda m: setattr(m, "rollout_logprobs", f32(-1, 0.5, -1)), "a log-probability is <= 0"),
    "teacher inf": (lambda m: setattr(m, "teacher_logprobs", f32(-1, float("-inf"), -1)), "teacher_logprobs must"),
    "token version": (lambda m: setattr(m, "token_versions", i32(1, 4, 1)), "token_versions outside 0..3"),
    "weight version": (lambda m: setattr(m, "weight_version", 4), "weight_version 4 is newer"),
    "short mask": (lambda m: setattr(m, "loss_mask", bytes([1, 1])), "loss_mask has 2 entries but response_ids has 3"),
    "empty group": (lambda m: setattr(m, "group_id", ""), "group_id is empty"),
}


def test_a_good_batch_passes_and_failed_samples_may_hold_nan() -> None:
    batch = [good(i) for i in range(4)]
    batch[1].status = sample_pb2.SAMPLE_STATUS_FAILED
    batch[1].rollout_logprobs = f32(float("nan"), 0.0, 1.0)       # a FAILED sample's logprobs are not read
    assert first_invalid(batch, LIMITS) is None
    assert first_invalid([], LIMITS) is None


@pytest.mark.parametrize("name", sorted(BREAKAGES))
def test_the_first_bad_sample_is_named_with_validate_messages_words(name: str) -> None:
    breakage, words = BREAKAGES[name]
    batch = [good(i) for i in range(4)]
    breakage(batch[2])
    breakage(batch[3])                               # a later bad sample: the first one is named
    got = first_invalid(batch, LIMITS)
    assert got is not None and got[0] == 2 and words in str(got[1])
    alone = first_invalid([batch[2]], LIMITS)        # one sample: the per-sample path, same verdict
    assert alone is not None and alone[0] == 0 and words in str(alone[1])
