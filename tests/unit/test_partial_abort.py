"""Aborting a group's engine requests through its GroupContext, and the work loop aborting every group in flight when
the buffer says the run is finished (over-sampled work no longer needed) — engine slots and KV freed at once."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import cast

import grpc

from rlfleet.protocols import Generation, GroupTicket, Prompt, RolloutContext, SamplingParams
from rlfleet.sample import Sample, Status
from rlfleet.services.rollout.context import GroupAborted, GroupContext
from rlfleet.services.rollout.engines.base import Abortable
from rlfleet.services.rollout.messages import status_of
from rlfleet.services.rollout.work_loop import WorkLoop, WorkSettings
from rlfleet.v1 import buffer_pb2, buffer_pb2_grpc, sample_pb2
from tests.support.engine_double import EngineDouble


class FakeEngine(EngineDouble, Abortable):
    """Requests stay pending until aborted (resolved with finish_reason 'abort')."""

    weight_version = 2

    def __init__(self) -> None:
        self.pending: list[Future[Generation]] = []
        self.aborted: list[Future[Generation]] = []

    def submit(self, ids: Sequence[int], sampling: SamplingParams) -> Future[Generation]:
        f: Future[Generation] = Future()
        self.pending.append(f)
        return f

    def abort(self, requests: Iterable[Future[Generation]]) -> int:
        futures = list(requests)
        for f in futures:
            self.pending.remove(f)
            self.aborted.append(f)
            f.set_result(Generation(output_ids=(5,), logprobs=(-1.0,), finish_reason="abort", weight_version=2))
        return len(futures)


class Ctx:
    replica_id, tokenizer, run_seed, sampling = "r0", None, 0, SamplingParams()

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    def generate(self, ids: Sequence[int], sampling: SamplingParams | None = None) -> Future[Generation]:
        return self.engine.submit(ids, sampling or self.sampling)

    def score(self, prompt: Prompt, sample: Sample) -> Sample:
        raise NotImplementedError("this context has no reward")

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        raise NotImplementedError("this context has no tokenizer")


def test_group_context_aborts_only_its_own_unfinished_requests() -> None:
    engine = FakeEngine()
    ctx = Ctx(engine)
    mine, other = GroupContext(ctx, engine), GroupContext(ctx, engine)
    done = mine.generate([1])
    done.set_result(Generation(output_ids=(4,), logprobs=(-1.0,), finish_reason="stop", weight_version=2))
    engine.pending.remove(done)
    a, b, c = mine.generate([1]), mine.generate([1]), other.generate([1])
    assert mine.replica_id == "r0"                                   # the rest passes through
    assert mine.abort() == 2 and engine.aborted == [a, b] and engine.pending == [c]
    try:
        mine.generate([1])
    except GroupAborted:
        pass
    else:
        raise AssertionError("an aborted group may not submit more requests")


class FinishingStub:
    """Claim: one ticket, then 'finished' once the group's requests are in the engine. Put: accepted."""

    def __init__(self, engine: FakeEngine, size: int) -> None:
        self.engine, self.size, self.claims = engine, size, 0
        self.puts: list[sample_pb2.Sample] = []

    def Claim(self, request: buffer_pb2.ClaimRequest, timeout: float) -> buffer_pb2.ClaimReply:
        self.claims += 1
        if self.claims == 1:
            assert request.restarted                               # the first Claim of a process says so
            return buffer_pb2.ClaimReply(tickets=[buffer_pb2.GroupTicket(group_id="g0", prompt_index=0,
                                                                         group_size=self.size)])
        assert not request.restarted
        while len(self.engine.pending) < self.size:
            threading.Event().wait(0.01)
        return buffer_pb2.ClaimReply(finished=True)

    def Put(self, data: bytes, timeout: float) -> buffer_pb2.PutReply:
        request = buffer_pb2.PutRequest.FromString(data)
        self.puts.extend(request.samples)
        return buffer_pb2.PutReply(accepted=len(request.samples))


def test_finished_run_aborts_the_groups_in_flight() -> None:
    def rollout_fn(ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket) -> Iterator[Sample]:
        futures = [ctx.generate([1, 2]) for _ in range(ticket.group_size)]
        for i, f in enumerate(futures):
            gen = f.result(timeout=10)
            yield Sample(group_id=ticket.group_id, index=i, group_size=ticket.group_size, prompt_ids=[1, 2],
                         response_ids=list(gen.output_ids), rollout_logprobs=list(gen.logprobs),
                         status=status_of(gen.finish_reason), weight_version=gen.weight_version)

    engine = FakeEngine()
    settings = WorkSettings(replica_id="r0", run_id="run", claim_groups=2)
    with grpc.insecure_channel("127.0.0.1:1") as ch:
        loop = WorkLoop(ch, engine, Ctx(engine), {0: Prompt(index=0, text="x")}, rollout_fn, settings,
                        threading.Event())
    stub = FinishingStub(engine, size=3)
    loop._stub = cast(buffer_pb2_grpc.BufferStub, stub)
    loop._putter._put = stub.Put
    assert loop.run() is True
    loop._pool.shutdown(wait=True)
    assert len(engine.aborted) == 3 and not engine.pending           # nothing left holding a slot
    assert sorted(s.index for s in stub.puts) == [0, 1, 2]
    assert all(s.status == Status.ABORTED for s in stub.puts)
