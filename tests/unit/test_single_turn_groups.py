"""The built-in single_turn on the work loop's collector thread (single_turn_groups.py): the samples single_turn
yields, put by the work loop; groups that cannot start; aborted groups; every claim slot freed."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path

import grpc
import pytest
import torch
from transformers import AutoTokenizer

from rlfleet.protocols import GroupTicket, Prompt, RolloutContext, SamplingParams
from rlfleet.rewards.scorer import Scorer
from rlfleet.sample import Sample, Status
from rlfleet.services.rollout.context import ServiceContext
from rlfleet.services.rollout.engines.torch_engine import TorchEngine
from rlfleet.services.rollout.group_collector import StartedGroup
from rlfleet.services.rollout.rollout_fns import single_turn
from rlfleet.services.rollout.single_turn_groups import SingleTurnGroups
from rlfleet.services.rollout.work_loop import SamplePutter, WorkLoop, WorkSettings
from rlfleet.v1 import buffer_pb2
from tests.support.engine_context import EngineContext

torch.set_num_threads(1)
SETTINGS = WorkSettings(replica_id="r0", run_id="run", claim_groups=8)
PROMPTS = {i: Prompt(index=i, text=f"{i}+{2 * i}=") for i in range(6)}


def length_reward(prompt: Prompt, completion: str, sample: Sample) -> dict[str, float]:
    return {"length": float(len(sample.response_ids)), "prompt": float(prompt.index)}


class RecordingStub:
    """Buffer.Put double: accepts everything, records each request's samples."""

    def __init__(self) -> None:
        self.puts: list[list[Sample]] = []
        self._lock = threading.Lock()

    def Put(self, data: bytes, timeout: float) -> buffer_pb2.PutReply:
        request = buffer_pb2.PutRequest.FromString(data)
        with self._lock:
            self.puts.append([Sample.from_proto(s) for s in request.samples])
        return buffer_pb2.PutReply(accepted=len(request.samples),
                                   outcomes=[buffer_pb2.PUT_ACCEPTED] * len(request.samples))


def collector_loop(tiny_engine: TorchEngine, tiny_model_dir: Path, data: dict[int, Prompt], seen: list[Sample],
                   stub: RecordingStub) -> tuple[WorkLoop, ServiceContext]:
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    ctx = ServiceContext("r0", tiny_engine, tok, SamplingParams(temperature=1.0, max_new_tokens=6),
                         Scorer(length_reward, 30.0), run_seed=7)
    with grpc.insecure_channel("127.0.0.1:1") as ch:
        loop = WorkLoop(ch, tiny_engine, ctx, data, single_turn, SETTINGS, threading.Event(), on_sample=seen.append)
    loop._putter = SamplePutter(stub.Put, SETTINGS, threading.Event())
    return loop, ctx


def wait_idle(loop: WorkLoop, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while loop.in_flight_groups and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loop.in_flight_groups == 0, "claim slots not freed"


def test_the_collector_puts_exactly_the_samples_single_turn_yields(tiny_engine: TorchEngine,
                                                                   tiny_model_dir: Path) -> None:
    stub, seen = RecordingStub(), list[Sample]()
    loop, ctx = collector_loop(tiny_engine, tiny_model_dir, PROMPTS, seen, stub)
    assert loop._collector is not None                  # the built-in single_turn takes the collector
    tickets = [GroupTicket(group_id=f"g{i}", prompt_index=i, group_size=4) for i in range(6)]
    for t in tickets:
        loop._start(t)
    wait_idle(loop)
    got = {(s.group_id, s.index): s for put in stub.puts for s in put}
    assert len(got) == 24 == sum(len(p) for p in stub.puts)          # each sample put once
    assert sorted((s.group_id, s.index) for s in seen) == sorted(got)
    for t in tickets:                                   # the reference: single_turn's own generator, group by group
        for ref in single_turn(ctx, PROMPTS[t.prompt_index], t):
            s = got[(t.group_id, ref.index)]
            assert s.response_ids == ref.response_ids and s.prompt_ids == ref.prompt_ids
            assert s.rollout_logprobs == pytest.approx(ref.rollout_logprobs, abs=1e-5)
            assert (s.status, s.reward, s.reward_parts) == (ref.status, ref.reward, ref.reward_parts)
            assert s.reward == len(s.response_ids) + t.prompt_index          # the parts summed
            assert (s.run_id, s.replica_id, s.prompt_index, s.group_size) == ("run", "r0", t.prompt_index, 4)
    loop.close()


def test_a_group_that_cannot_start_is_put_failed_and_the_others_go_on(tiny_engine: TorchEngine,
                                                                      tiny_model_dir: Path) -> None:
    stub, seen = RecordingStub(), list[Sample]()
    loop, _ = collector_loop(tiny_engine, tiny_model_dir, {0: PROMPTS[0], 2: Prompt(index=2)}, seen, stub)
    loop._start(GroupTicket(group_id="ok", prompt_index=0, group_size=3))
    loop._start(GroupTicket(group_id="missing", prompt_index=9, group_size=3))      # the data source raises
    loop._start(GroupTicket(group_id="empty", prompt_index=2, group_size=3))        # encode_prompt raises
    wait_idle(loop)
    got = {(s.group_id, s.index): s for put in stub.puts for s in put}
    assert sorted(got) == sorted((g, i) for g in ("ok", "missing", "empty") for i in range(3))
    assert all(got[("ok", i)].status in (Status.COMPLETED, Status.TRUNCATED) for i in range(3))
    for i in range(3):
        assert got[("missing", i)].status == Status.FAILED
        assert got[("missing", i)].status_reason == "rollout_fn raised KeyError: 9"
        assert got[("empty", i)].status == Status.FAILED
        assert got[("empty", i)].status_reason.startswith("rollout_fn raised ValueError: prompt 2 has no")
    loop.close()


def test_a_cancelled_groups_requests_are_aborted_and_its_samples_put_aborted(tiny_engine: TorchEngine,
                                                                             tiny_model_dir: Path) -> None:
    stub, seen = RecordingStub(), list[Sample]()
    loop, _ = collector_loop(tiny_engine, tiny_model_dir, PROMPTS, seen, stub)
    tiny_engine.pause()                                      # the requests wait in the tiny_engine until resumed
    try:
        loop._start(GroupTicket(group_id="keep", prompt_index=1, group_size=2))
        loop._start(GroupTicket(group_id="cancel", prompt_index=2, group_size=2))
        assert loop.abort_cancelled(["cancel"]) == 2
    finally:
        tiny_engine.resume()
    wait_idle(loop)
    got = {(s.group_id, s.index): s for put in stub.puts for s in put}
    assert [got[("cancel", i)].status for i in range(2)] == [Status.ABORTED] * 2
    assert [got[("cancel", i)].reward for i in range(2)] == [0.0, 0.0]          # never scored
    assert all(got[("keep", i)].status in (Status.COMPLETED, Status.TRUNCATED) for i in range(2))
    loop.close()


def test_other_rollout_functions_and_the_off_switch_keep_a_thread_per_group(tiny_engine: TorchEngine) -> None:
    def mine(ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket) -> Iterator[Sample]:
        yield from single_turn(ctx, prompt, ticket)

    ctx = EngineContext(tiny_engine)
    with grpc.insecure_channel("127.0.0.1:1") as ch:
        other = WorkLoop(ch, tiny_engine, ctx, PROMPTS, mine, SETTINGS, threading.Event())
        off = WorkLoop(ch, tiny_engine, ctx, PROMPTS, single_turn, SETTINGS, threading.Event(), collector=False)
    assert other._collector is None and off._collector is None
    other.close()
    off.close()


def test_a_finished_group_is_freed_by_reference_counting(tiny_engine: TorchEngine, tiny_model_dir: Path) -> None:
    """Once put, a group, its engine futures and their generations are freed at once, not left as a reference cycle
    for a full garbage collection to find (one held a replica's GIL ~0.2 s every ~2 s on the addition example)."""
    stub, seen = RecordingStub(), list[Sample]()
    loop, _ = collector_loop(tiny_engine, tiny_model_dir, PROMPTS, seen, stub)
    assert loop._collector is not None
    assert isinstance(loop._collector, SingleTurnGroups)             # single_turn's declared collector
    finish = loop._collector._finish
    freed: list[weakref.ref[object]] = []

    def recording(batch: Sequence[StartedGroup]) -> None:
        freed.extend(weakref.ref(o) for g in batch for o in (g, *g.requests, *(r.result() for r in g.requests)))
        finish(batch)

    loop._collector._finish = recording
    gc.disable()
    try:
        for i in range(4):
            loop._start(GroupTicket(group_id=f"g{i}", prompt_index=i, group_size=3))
        wait_idle(loop)
        deadline = time.monotonic() + 10
        while any(r() is not None for r in freed) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(freed) == 4 * (1 + 3 + 3)
        assert [r() for r in freed] == [None] * len(freed)
    finally:
        gc.enable()
    loop.close()
