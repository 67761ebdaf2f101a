"""Sample <-> rlfleet.v1.Sample round trips, and malformed samples are refused with the reason."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from rlfleet.sample import RoutedExperts, Sample, SampleError, Status, validate_message
from rlfleet.v1 import sample_pb2


def _sample(**kw: object) -> Sample:
    base = dict(group_id="g1", index=1, group_size=4, prompt_ids=[1, 5, 6], response_ids=[7, 8, 2],
                rollout_logprobs=[-0.5, -1.25, -0.125], reward=1.0, weight_version=3, prompt_index=42)
    base.update(kw)
    return Sample(**base)  # type: ignore[arg-type]


def test_round_trip_keeps_every_field() -> None:
    s = _sample(loss_mask=[1, 0, 1], reward_parts={"format": 0.5, "correct": 0.5}, status=Status.TRUNCATED,
                status_reason="length", token_versions=[3, 3, 4], teacher_logprobs=[-0.1, -0.2, -0.3],
                metadata={"k": "v"}, run_id="r", replica_id="rollout-0", reward_baseline=0.25,
                routed_experts=RoutedExperts(ids=np.arange(3 * 2 * 2).reshape(3, 2, 2)))
    back = Sample.from_proto(Sample.from_proto(s.to_proto()).to_proto())
    assert back.response_ids == s.response_ids and back.prompt_ids == s.prompt_ids
    assert back.rollout_logprobs == s.rollout_logprobs  # exactly representable in float32
    assert back.loss_mask == [1, 0, 1] and back.token_versions == [3, 3, 4]
    assert back.reward_parts == {"format": 0.5, "correct": 0.5}
    assert back.status is Status.TRUNCATED and back.metadata == {"k": "v"} and back.weight_version == 3
    assert s.routed_experts is not None
    assert back.routed_experts is not None and back.routed_experts.ids.tolist() == s.routed_experts.ids.tolist()
    assert back.to_proto().routed_experts.bits == 8
    assert back.reward_baseline == 0.25 and Sample.from_proto(_sample().to_proto()).reward_baseline is None


def test_wide_expert_ids_use_16_bits() -> None:
    s = _sample(routed_experts=RoutedExperts(ids=np.full((3, 1, 2), 300)))
    msg = s.to_proto()
    assert msg.routed_experts.bits == 16
    back = Sample.from_proto(msg).routed_experts
    assert back is not None and back.ids.max() == 300


def test_token_arrays_are_packed_bytes() -> None:
    msg = _sample().to_proto()
    assert isinstance(msg.response_ids, bytes) and len(msg.response_ids) == 12
    assert len(msg.rollout_logprobs) == 12 and len(msg.loss_mask) == 3


@pytest.mark.parametrize("mutate, reason", [
    (lambda m: setattr(m, "rollout_logprobs", m.rollout_logprobs[:4]), "rollout_logprobs has 1 entries"),
    (lambda m: setattr(m, "loss_mask", b"\x01"), "loss_mask has 1 entries"),
    (lambda m: setattr(m, "reward", math.nan), "reward is nan"),
    (lambda m: setattr(m, "reward_baseline", math.inf), "reward_baseline is inf"),
    (lambda m: setattr(m, "status", 9), "unknown status 9"),
    (lambda m: setattr(m, "index", 4), "index 4 outside group_size 4"),
    (lambda m: setattr(m, "group_id", ""), "group_id is empty"),
    (lambda m: setattr(m, "response_ids", b"\x00\x01\x02"), "not a multiple of 4"),
])
def test_malformed_samples_are_refused(mutate: Callable[[sample_pb2.Sample], None], reason: str) -> None:
    msg = _sample().to_proto()
    mutate(msg)
    with pytest.raises(SampleError, match=reason):
        validate_message(msg)


def test_nan_logprob_refused_but_failed_sample_may_carry_none() -> None:
    with pytest.raises(SampleError, match="NaN"):
        _sample(rollout_logprobs=[0.0, math.nan, 0.0]).validate()
    _sample(status=Status.FAILED, response_ids=[], rollout_logprobs=[], status_reason="reward_fn raised").validate()
