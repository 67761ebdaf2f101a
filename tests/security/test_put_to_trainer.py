"""Put -> trainer: whatever the buffer's Put validation accepts, the trainer decodes without an exception.

A sample that passes Put but makes Sample.from_proto or build_train_batch raise is a crash loop: the trainer exits,
and its resume gets the same batch again. So every message Put accepts must either be trained on (decoded, laid
out in a TrainBatch with routes and token versions) or quarantined by the trainer's batch check (BatchUnusable),
never raised in the step. Hypothesis draws sample messages near every edge (lengths off by one, routes of zero
layers or top_k, 16-bit expert ids, masks outside {0,1}, NaN and positive logprobs, versions past int64), 1,000
examples, derandomized so CI sees the same ones every run; in-process, a few ms an example.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rlfleet.sample import Sample, SampleError, validate_message
from rlfleet.sample.batch_check import first_invalid
from rlfleet.sample.limits import MAX_EXPERT_ID, SampleLimits, model_limits
from rlfleet.services.trainer.batch import build_train_batch, rank_groups
from rlfleet.services.trainer.batch_check import BatchLimits, BatchUnusable, check_batch
from rlfleet.v1 import buffer_pb2, sample_pb2

VOCAB = 100
_U64 = [0, 1, 2, 7, 2**31, 2**63 - 1, 2**63, 2**64 - 1]


def _i32(values: list[int]) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


def _f32(values: list[float]) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def _rare(draw: Any, good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> Any:
    """Mostly a good value, one time in 25 a bad one: a sample with a dozen fields still passes Put often."""
    return draw(bad) if draw(st.integers(0, 24)) == 13 else draw(good)     # not 0: Hypothesis favours bounds


def _about(draw: Any, n: int, values: st.SearchStrategy[Any]) -> list[Any]:
    """A list of n values, now and then one off or empty."""
    size = _rare(draw, st.just(n), st.sampled_from([0, n + 1, max(n - 1, 0)]))
    return list(draw(st.lists(values, min_size=size, max_size=size)))


@st.composite
def routes(draw: Any, tokens: int) -> sample_pb2.RoutedExperts:
    layers = _rare(draw, st.integers(1, 3), st.sampled_from([0, 300, 2**32 - 1]))
    top_k = _rare(draw, st.integers(1, 3), st.sampled_from([0, 65, 2**32 - 1]))
    bits = _rare(draw, st.sampled_from([8, 16]), st.sampled_from([0, 7]))
    width = 2 if bits == 16 else 1
    top = _rare(draw, st.sampled_from([3, 7, 255]), st.sampled_from([2**15 - 1, 2**15, 2**16 - 1])) if width == 2 \
        else 255
    experts = st.integers(0, top) if draw(st.booleans()) else st.integers(0, 7)
    if layers * top_k <= 64:
        ids = _about(draw, tokens * layers * top_k, experts)
    else:
        ids = draw(st.lists(experts, max_size=8))
    data = np.asarray(ids, dtype=np.uint8 if width == 1 else "<u2").tobytes()
    free = bytes(_about(draw, tokens, st.integers(0, 2))) if draw(st.booleans()) else b""
    return sample_pb2.RoutedExperts(num_layers=layers, top_k=top_k, bits=bits, ids=data, free_rows=free)


@st.composite
def sample_messages(draw: Any) -> sample_pb2.Sample:
    tokens = draw(st.integers(0, 5))
    group_size = _rare(draw, st.integers(1, 3), st.just(0))
    msg = sample_pb2.Sample(
        run_id="r", group_id=_rare(draw, st.sampled_from(["g0", "g1", "g2"]), st.just("")),
        index=_rare(draw, st.integers(0, max(group_size - 1, 0)), st.integers(0, 2**32 - 1)),
        group_size=group_size, prompt_index=draw(st.integers(0, 2)),
        status=_rare(draw, st.sampled_from([1, 2, 3, 4]), st.sampled_from([0, 5, 99])),
        reward=_rare(draw, st.floats(-10, 10, width=32), st.floats(width=32)),
        weight_version=_rare(draw, st.integers(0, 6), st.sampled_from(_U64)),
        weight_epoch=draw(st.sampled_from(_U64)), replica_id="rollout-0")
    ids = st.integers(0, VOCAB - 1)
    msg.prompt_ids = _i32(draw(st.lists(ids, max_size=4)) + _rare(draw, st.just([]), st.sampled_from(
        [[-1], [VOCAB], [2**31 - 1]])))
    msg.response_ids = _i32(draw(st.lists(ids, min_size=tokens, max_size=tokens)))
    msg.prompt_ids += _rare(draw, st.just(b""), st.just(b"\x00"))      # a byte length that is no whole int32
    odd = st.sampled_from([float("nan"), float("inf"), 0.5, 2e-3, 1e-3])
    msg.rollout_logprobs = _f32(_about(draw, tokens, st.floats(-20, 0, width=32))[:-1] + [_rare(draw, st.floats(
        -20, 0, width=32), odd)] if tokens else [])
    if _rare(draw, st.just(True), st.just(False)):          # absent: a wrong length unless there is no response
        msg.loss_mask = bytes(_about(draw, tokens, st.integers(0, 1)))
    if draw(st.booleans()):
        odd_versions = st.sampled_from([-1, 7, 2**31 - 1, -2**31])
        msg.token_versions = _i32(_about(draw, tokens, st.integers(0, 6)) + _rare(draw, st.just([]), st.lists(
            odd_versions, min_size=1, max_size=1)))
    if draw(st.integers(0, 3)) == 0:
        msg.teacher_logprobs = _f32([_rare(draw, st.floats(-20, 0, width=32), odd) for _ in range(tokens)])
    if draw(st.booleans()):
        msg.routed_experts.CopyFrom(draw(routes(tokens)))
    if draw(st.integers(0, 4)) == 0:
        msg.reward_parts["format"] = _rare(draw, st.floats(-1, 1, width=32), st.floats(width=32))
    if draw(st.integers(0, 3)) == 0:                     # ReMax's greedy baseline reward
        msg.reward_baseline = _rare(draw, st.floats(-10, 10, width=32), st.floats(width=32))
    return msg


def _limits(experts: int | None, newest: int | None, max_expert_id: int | None = MAX_EXPERT_ID,
            max_seq_len: int | None = None) -> SampleLimits:
    """The buffer's Put limits (rlfleet.sample.limits.model_limits, put_max_seq_len, the policy version + lead)."""
    return SampleLimits(vocab_size=VOCAB, num_experts=experts, max_weight_version=newest, max_expert_id=max_expert_id,
                        max_seq_len=max_seq_len)


def train_or_quarantine(msgs: list[sample_pb2.Sample]) -> tuple[int, int]:
    """What the trainer does with a batch of these samples: (samples trained, groups quarantined). Raises whatever
    the trainer would raise in its step."""
    gids = list(dict.fromkeys(m.group_id for m in msgs))
    batch = buffer_pb2.Batch(step=0, samples=msgs, group_ids=gids, complete=True)
    quarantined: dict[str, str] = {}
    try:
        check_batch(batch, BatchLimits(vocab_size=VOCAB))
    except BatchUnusable as exc:
        quarantined = exc.groups
    kept = buffer_pb2.Batch(step=0, samples=[m for m in msgs if m.group_id not in quarantined],
                            group_ids=[g for g in gids if g not in quarantined], complete=True)
    groups = rank_groups(kept, 0, 1)
    samples = [s for g in groups for s in g]
    if samples:
        tb = build_train_batch(samples, routes=True)
        assert tb.input_ids.shape[0] == len(samples)
    return len(samples), len(quarantined)


@settings(max_examples=1000, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(msgs=st.lists(sample_messages(), min_size=1, max_size=3),
       experts=st.sampled_from([None, 8, 2**16]), newest=st.sampled_from([None, 0, 5]),
       max_expert_id=st.sampled_from([MAX_EXPERT_ID, None]), max_seq_len=st.sampled_from([None, 6]))
def test_what_put_accepts_the_trainer_trains_or_quarantines(msgs: list[sample_pb2.Sample], experts: int | None,
                                                           newest: int | None, max_expert_id: int | None,
                                                           max_seq_len: int | None) -> None:
    """max_expert_id None: a buffer built without model_limits (its own default); the trainer then quarantines."""
    limits = _limits(experts, newest, max_expert_id, max_seq_len)
    accepted = first_invalid(msgs, limits) is None
    singles = []
    for m in msgs:                                   # Put's one-sample path says the same of each sample
        try:
            validate_message(m, limits)
            singles.append(True)
        except SampleError:
            singles.append(False)
    assert accepted == all(singles)
    event("put: accepted" if accepted else "put: refused")
    if not accepted:
        return
    for m in msgs:
        s = Sample.from_proto(m)                     # the trainer's decoding of each sample
        assert len(s.rollout_logprobs) == len(s.response_ids)
    trained, quarantined = train_or_quarantine(msgs)
    assert trained + quarantined > 0
    event("trainer: quarantined a group" if quarantined else "trainer: trained all")
    if any(m.HasField("routed_experts") for m in msgs):
        event("accepted with routes")


def _routed(layers: int, top_k: int, group: str = "g0") -> sample_pb2.Sample:
    return sample_pb2.Sample(run_id="r", group_id=group, index=0, group_size=1, prompt_ids=_i32([1, 2]),
                             status=sample_pb2.SAMPLE_STATUS_COMPLETED, response_ids=_i32([3]),
                             rollout_logprobs=_f32([-0.5]), loss_mask=b"\x01",
                             routed_experts=sample_pb2.RoutedExperts(
                                 num_layers=layers, top_k=top_k, bits=8, ids=bytes(layers * top_k)))


def test_routes_of_zero_layers_or_top_k_are_refused_at_put() -> None:
    """The poison sample of issue 40: bits 8, no ids, num_layers or top_k 0 passed Put, then raised in the step."""
    for layers, top_k in ((0, 2), (2, 0), (0, 0)):
        msg = _routed(layers, top_k)
        msg.response_ids, msg.rollout_logprobs, msg.loss_mask = b"", b"", b""
        bad = first_invalid([msg], _limits(None, None))
        assert bad is not None and "routed_experts" in str(bad[1])


def test_routes_of_another_shape_are_quarantined_not_raised() -> None:
    """Each sample alone is fine; together their routes cannot share one tensor: the odd group is quarantined."""
    msgs = [_routed(2, 2, "g0"), _routed(2, 2, "g1"), _routed(3, 1, "g2")]
    assert first_invalid(msgs, _limits(8, None)) is None
    trained, quarantined = train_or_quarantine(msgs)
    assert (trained, quarantined) == (2, 1)


def test_expert_ids_past_int16_are_refused_at_put_and_quarantined_by_the_trainer() -> None:
    msg = _routed(1, 1)
    msg.routed_experts.bits = 16
    msg.routed_experts.ids = np.asarray([2**15], dtype="<u2").tobytes()
    bad = first_invalid([msg], model_limits(Path("/nonexistent")))       # the buffer's limits, no config.json
    assert bad is not None and "int16" in str(bad[1])
    assert train_or_quarantine([msg, _routed(1, 1, "g1")]) == (1, 1)
