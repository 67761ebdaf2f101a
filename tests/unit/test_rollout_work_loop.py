"""The work loop's delivery rules: retry retryable Put errors, keep a failing rollout function's group complete."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc

from rlfleet.protocols import GroupTicket, Prompt, RolloutContext, RolloutFn
from rlfleet.sample import Sample, Status
from rlfleet.services.rollout.work_loop import SamplePutter, WorkLoop, WorkSettings
from rlfleet.v1 import buffer_pb2
from tests.support.engine_context import EngineContext
from tests.support.engine_double import EngineDouble

SETTINGS = WorkSettings(replica_id="r0", run_id="run", claim_groups=1)


class Code(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._code.name


class FakeStub:
    def __init__(self, errors: list[grpc.StatusCode]) -> None:
        self.errors = list(errors)
        self.puts: list[buffer_pb2.PutRequest] = []

    def Put(self, data: bytes, timeout: float) -> buffer_pb2.PutReply:
        request = buffer_pb2.PutRequest.FromString(data)          # what the buffer parses from the framed bytes
        self.puts.append(request)
        if self.errors:
            raise Code(self.errors.pop(0))
        return buffer_pb2.PutReply(accepted=len(request.samples))


def sample(index: int) -> Sample:
    return Sample(group_id="g", index=index, group_size=3, prompt_ids=[1], response_ids=[4], rollout_logprobs=[-1.0])


def test_put_retries_until_the_buffer_takes_the_sample() -> None:
    stub = FakeStub([grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED])
    assert SamplePutter(stub.Put, SETTINGS, threading.Event()).put(sample(0))
    assert len(stub.puts) == 3 and all(p.samples[0].group_id == "g" for p in stub.puts)


def test_put_refused_as_invalid_is_not_retried() -> None:
    stub = FakeStub([grpc.StatusCode.INVALID_ARGUMENT])
    assert not SamplePutter(stub.Put, SETTINGS, threading.Event()).put(sample(0))
    assert len(stub.puts) == 1


class FakeEngine(EngineDouble):
    weight_version = 4


def test_failing_rollout_fn_puts_failed_samples_for_the_rest_of_its_group() -> None:
    def rollout_fn(ctx: object, prompt: Prompt, ticket: GroupTicket) -> Iterator[Sample]:
        yield sample(1)
        raise RuntimeError("boom")

    with grpc.insecure_channel("127.0.0.1:1") as ch:
        engine = FakeEngine()
        loop = WorkLoop(ch, engine, EngineContext(engine), {7: Prompt(index=7, text="x")}, rollout_fn, SETTINGS,
                        threading.Event())
    stub = FakeStub([])
    loop._putter = SamplePutter(stub.Put, SETTINGS, threading.Event())
    loop._run_group(GroupTicket(group_id="g", prompt_index=7, group_size=3))
    got = {s.index: s for p in stub.puts for s in p.samples}
    assert sorted(got) == [0, 1, 2]
    assert got[1].status == Status.COMPLETED and got[1].run_id == "run" and got[1].replica_id == "r0"
    for i in (0, 2):
        assert got[i].status == Status.FAILED and got[i].status_reason == "rollout_fn raised RuntimeError: boom"
        assert got[i].prompt_index == 7 and got[i].weight_version == 4
    loop.close()


class RefusesIndex(FakeStub):
    """Refuses (INVALID_ARGUMENT) any request holding the sample with index `bad`, as the buffer refuses a whole
    call with one malformed sample; answers the rest with per-sample outcomes."""

    def __init__(self, bad: int, outcome: buffer_pb2.PutOutcome = buffer_pb2.PUT_ACCEPTED) -> None:
        super().__init__([])
        self.bad, self.outcome = bad, outcome

    def Put(self, data: bytes, timeout: float) -> buffer_pb2.PutReply:
        request = buffer_pb2.PutRequest.FromString(data)
        self.puts.append(request)
        if any(s.index == self.bad for s in request.samples):
            raise Code(grpc.StatusCode.INVALID_ARGUMENT)
        return buffer_pb2.PutReply(accepted=len(request.samples), outcomes=[self.outcome] * len(request.samples))


def _loop_with(stub: FakeStub, rollout_fn: RolloutFn, seen: list[Sample]) -> WorkLoop:
    with grpc.insecure_channel("127.0.0.1:1") as ch:
        engine = FakeEngine()
        loop = WorkLoop(ch, engine, EngineContext(engine), {7: Prompt(index=7, text="x")}, rollout_fn, SETTINGS,
                        threading.Event(), on_sample=seen.append)
    loop._putter = SamplePutter(stub.Put, SETTINGS, threading.Event())
    return loop


def test_a_groups_samples_are_put_in_one_request() -> None:
    def rollout_fn(ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket) -> Iterator[Sample]:
        yield from (sample(i) for i in (2, 0, 1))

    stub, seen = RefusesIndex(bad=-1), list[Sample]()
    loop = _loop_with(stub, rollout_fn, seen)
    loop._run_group(GroupTicket(group_id="g", prompt_index=7, group_size=3))
    assert len(stub.puts) == 1 and [s.index for s in stub.puts[0].samples] == [2, 0, 1]
    assert [s.index for s in seen] == [2, 0, 1]            # each accepted sample reported
    loop.close()


def test_one_bad_sample_refuses_only_itself() -> None:
    def rollout_fn(ctx: RolloutContext, prompt: Prompt, ticket: GroupTicket) -> Iterator[Sample]:
        yield from (sample(i) for i in range(3))

    stub, seen = RefusesIndex(bad=1), list[Sample]()
    loop = _loop_with(stub, rollout_fn, seen)
    loop._run_group(GroupTicket(group_id="g", prompt_index=7, group_size=3))
    assert [len(p.samples) for p in stub.puts] == [3, 1, 1, 1]  # the whole, then one by one
    assert [s.index for s in seen] == [0, 2]
    loop.close()


def test_per_sample_outcomes_are_reported_as_the_buffer_gives_them() -> None:
    stub = RefusesIndex(bad=-1, outcome=buffer_pb2.PUT_CANCELLED)
    putter = SamplePutter(stub.Put, SETTINGS, threading.Event())
    assert putter.deliver_many([sample(0), sample(1)]) == ["cancelled", "cancelled"]
    mixed = buffer_pb2.PutReply(accepted=1, duplicates=1, outcomes=[buffer_pb2.PUT_DUPLICATE, buffer_pb2.PUT_ACCEPTED])
    putter = SamplePutter(lambda data, timeout: mixed, SETTINGS, threading.Event())
    assert putter.deliver_many([sample(0), sample(1)]) == ["duplicate", "accepted"]


class GatedStub:
    """Buffer.Put double: the first Put waits at a gate; each sample's outcome follows its group's name
    ("dup*": duplicate, else accepted); a Put of several samples holding a group "bad" is refused whole."""

    def __init__(self) -> None:
        self.gate, self.entered = threading.Event(), threading.Event()
        self.puts: list[list[str]] = []

    def Put(self, data: bytes, timeout: float) -> buffer_pb2.PutReply:
        request = buffer_pb2.PutRequest.FromString(data)
        groups = [s.group_id for s in request.samples]
        self.puts.append(groups)
        if len(self.puts) == 1:
            self.entered.set()
            assert self.gate.wait(30)
        if "bad" in groups:
            raise Code(grpc.StatusCode.INVALID_ARGUMENT)
        return buffer_pb2.PutReply(outcomes=[buffer_pb2.PUT_DUPLICATE if g.startswith("dup") else
                                             buffer_pb2.PUT_ACCEPTED for g in groups])


def group_samples(group: str, n: int = 2) -> list[Sample]:
    return [Sample(group_id=group, index=i, group_size=n, prompt_ids=[1], response_ids=[4], rollout_logprobs=[-1.0])
            for i in range(n)]


def test_groups_that_finish_together_share_a_put_and_each_gets_its_own_outcomes() -> None:
    stub = GatedStub()
    putter = SamplePutter(stub.Put, SETTINGS, threading.Event())
    names = ["first", "a", "dup1", "b", "dup2", "c", "d"]
    results: dict[str, list[str]] = {}

    def deliver(name: str) -> None:
        results[name] = putter.deliver_many(group_samples(name))

    threads = [threading.Thread(target=deliver, args=(n,)) for n in names]
    threads[0].start()
    assert stub.entered.wait(30)                      # the first Put is in flight ...
    for t in threads[1:]:
        t.start()
    while len(putter._queue) < len(names) - 1:        # ... while the other six groups queue behind it
        threading.Event().wait(0.001)
    stub.gate.set()
    for t in threads:
        t.join(30)
    assert [len(p) for p in stub.puts] == [2, 12]     # two Puts for seven groups
    assert sorted(set(stub.puts[1])) == sorted(names[1:])
    for name in names:
        assert results[name] == ["duplicate"] * 2 if name.startswith("dup") else ["accepted"] * 2, name


def test_a_shared_put_refused_whole_is_retried_per_sample_and_only_the_bad_group_is_lost() -> None:
    stub = GatedStub()
    putter = SamplePutter(stub.Put, SETTINGS, threading.Event())
    results: dict[str, list[str]] = {}

    def deliver(name: str) -> None:
        results[name] = putter.deliver_many(group_samples(name))

    first = threading.Thread(target=deliver, args=("first",))
    first.start()
    assert stub.entered.wait(30)
    rest = [threading.Thread(target=deliver, args=(n,)) for n in ("a", "bad", "dup")]
    for t in rest:
        t.start()
    while len(putter._queue) < 3:
        threading.Event().wait(0.001)
    stub.gate.set()
    for t in [first, *rest]:
        t.join(30)
    assert results == {"first": ["accepted"] * 2, "a": ["accepted"] * 2, "bad": ["refused"] * 2,
                       "dup": ["duplicate"] * 2}
    assert [len(p) for p in stub.puts] == [2, 6, 1, 1, 1, 1, 1, 1]     # the shared Put, then one per sample
