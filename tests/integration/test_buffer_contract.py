"""The buffer contract, run against both stores (embedded log, real redis-server) through BufferCore."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from rlfleet.services.buffer.core import BufferCore
from rlfleet.services.buffer.errors import BufferFull, InvalidRequest, InvalidSample, StepCommitted, UnknownGroup
from rlfleet.services.buffer.filters import load_filters
from rlfleet.services.buffer.results import PutResult
from rlfleet.services.buffer.settings import BufferSettings
from rlfleet.services.buffer.stores import Store, StoreError
from rlfleet.services.buffer.stores.embedded import EmbeddedStore
from rlfleet.services.buffer.stores.redis_streams import RedisStore
from rlfleet.v1 import buffer_pb2, sample_pb2
from tests.support.redis_server import RedisServer

COMPLETED, FAILED, ABORTED = (sample_pb2.SAMPLE_STATUS_COMPLETED, sample_pb2.SAMPLE_STATUS_FAILED,
                              sample_pb2.SAMPLE_STATUS_ABORTED)
_prefixes = itertools.count()


def make_sample(gid: str, index: int, group_size: int, prompt_index: int | None = None, tokens: int = 4,
                reward: float | None = None, version: int = 0,
                status: sample_pb2.SampleStatus = COMPLETED) -> sample_pb2.Sample:
    """A well-formed sample; reward defaults to the index so groups are not all-equal."""
    return sample_pb2.Sample(
        group_id=gid, index=index, group_size=group_size,
        prompt_index=int(gid[1:]) if prompt_index is None else prompt_index,
        prompt_ids=np.arange(3, dtype="<i4").tobytes(), response_ids=np.arange(tokens, dtype="<i4").tobytes(),
        loss_mask=np.ones(tokens, dtype="u1").tobytes(), rollout_logprobs=np.full(tokens, -0.5, "<f4").tobytes(),
        reward=float(index) if reward is None else reward, status=status, weight_version=version)


def group(ticket_gid: str, size: int, **kw: object) -> list[sample_pb2.Sample]:
    return [make_sample(ticket_gid, i, size, **kw) for i in range(size)]  # type: ignore[arg-type]


def drop_prompt_one(group: list) -> str | None:
    """A user SampleFilter (loaded by dotted path in a test)."""
    return "prompt 1 is unwanted" if group[0].prompt_index == 1 else None


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


Factory = Callable[..., BufferCore]


@pytest.fixture(params=["embedded", "redis"])
def make_core(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """make_core(**settings) opens a core on this test's store; calling it again simulates a buffer restart."""
    prefix = f"test{next(_prefixes)}"
    opened: list[BufferCore] = []

    def make(clock: Callable[[], float] = time.time, filters: tuple[str, ...] = (), **kw: object) -> BufferCore:
        defaults: dict = dict(capacity=64, group_size=2, groups_per_step=1, steps=100, max_staleness=100,
                              lease_seconds=60.0, min_valid_per_group=1)
        settings = BufferSettings(**{**defaults, **kw})
        store: Store
        if request.param == "embedded":
            store = EmbeddedStore(tmp_path / "buffer", fsync="always")
        else:
            store = RedisStore(request.getfixturevalue("redis_server").url, prefix=prefix)
        for old in opened:
            old.close()
        opened.clear()
        core = BufferCore(store, settings, load_filters(filters), clock=clock)
        opened.append(core)
        return core

    yield make
    for core in opened:
        core.close()


def counts(res: PutResult) -> tuple[int, int, int]:
    return res.accepted, res.duplicates, res.cancelled


def claim_one(core: BufferCore, version: int = 0, replica: str = "r0") -> str:
    res = core.claim(replica, version, 1, 0)
    assert len(res.tickets) == 1, res.reason
    return res.tickets[0].group_id


def test_put_get_ack_roundtrip(make_core: Factory) -> None:
    core = make_core(group_size=3)
    gid = claim_one(core)
    assert gid == "g0"
    assert counts(core.put(group(gid, 3)[::-1], 0)) == (3, 0, 0)
    batch = core.get_batch(0, 1, 0, 0)
    assert batch.complete and not batch.redelivered and batch.group_ids == [gid]
    assert [sample_pb2.Sample.FromString(d).index for d in batch.samples] == [0, 1, 2]
    assert batch.samples[1] == make_sample(gid, 1, 3).SerializeToString()      # raw bytes, untouched
    assert core.stats().delivered_unacked == 3
    assert core.ack(0) == 3
    s = core.stats()
    assert (s.acked_samples, s.put_samples, s.stored_samples, s.delivered_unacked) == (3, 3, 0, 0)


def test_duplicates_late_puts_and_unknown_groups(make_core: Factory) -> None:
    core = make_core()
    gid = claim_one(core)
    assert counts(core.put([make_sample(gid, 0, 2)], 0)) == (1, 0, 0)
    assert counts(core.put([make_sample(gid, 0, 2), make_sample(gid, 0, 2)], 0)) == (0, 2, 0)
    mixed = core.put([make_sample(gid, 0, 2), make_sample(gid, 1, 2), make_sample(gid, 1, 2)], 0)
    assert counts(mixed) == (1, 2, 0)
    assert mixed.outcomes == (buffer_pb2.PUT_DUPLICATE, buffer_pb2.PUT_ACCEPTED, buffer_pb2.PUT_DUPLICATE)
    core.get_batch(0, 1, 0, 0)
    core.ack(0)
    assert counts(core.put(group(gid, 2), 0)) == (0, 2, 0)          # committed: ignored
    core = make_core()                                   # and still ignored after a restart
    assert counts(core.put(group(gid, 2), 0)) == (0, 2, 0)
    assert core.stats().put_samples == 2
    with pytest.raises(UnknownGroup):
        core.put([make_sample("g99", 0, 2)], 0)


@pytest.mark.parametrize("breakage", ["lengths", "nan_reward", "status", "size", "group_size"])
def test_malformed_samples_are_refused_and_never_stored(make_core: Factory, breakage: str) -> None:
    core = make_core(max_sample_bytes=4096)
    gid = claim_one(core)
    bad = make_sample(gid, 1, 2)
    if breakage == "lengths":
        bad.rollout_logprobs = np.zeros(3, "<f4").tobytes()
    elif breakage == "nan_reward":
        bad.reward = float("nan")
    elif breakage == "status":
        bad.status = 17  # type: ignore[assignment]
    elif breakage == "size":
        bad.metadata["blob"] = "x" * 5000
    else:
        bad.group_size = 3
    with pytest.raises(InvalidSample) as err:
        core.put([make_sample(gid, 0, 2), bad], 0)      # the good one in the same call is not stored either
    assert f"{gid}/1" in str(err.value)
    assert core.stats().put_samples == 0 and core.stats().stored_samples == 0
    assert make_core(max_sample_bytes=4096).stats().put_samples == 0


def test_staleness_gate_synchronous(make_core: Factory) -> None:
    core = make_core(max_staleness=0, groups_per_step=2)
    claim_one(core), claim_one(core)                      # step 0 runs on version 0
    res = core.claim("r0", 0, 1, 0)
    assert not res.tickets and "staleness" in res.reason
    assert claim_one(core, version=1) == "g2"             # step 1 needs version 1


def test_staleness_gate_two_versions_ahead(make_core: Factory) -> None:
    core = make_core(max_staleness=2, groups_per_step=1)
    assert [claim_one(core) for _ in range(3)] == ["g0", "g1", "g2"]   # steps 0, 1, 2 on version 0
    assert "staleness" in core.claim("r0", 0, 4, 0).reason
    assert claim_one(core, version=1) == "g3"


def test_stale_groups_dropped_at_get_batch(make_core: Factory) -> None:
    core = make_core(max_staleness=2)
    old, new = claim_one(core), claim_one(core)
    core.put(group(old, 2, version=0), 0)
    core.put(group(new, 2, version=1), 0)
    batch = core.get_batch(0, 1, 3, 0)                    # floor = 3 - 2 = 1
    assert batch.group_ids == [new]
    assert dict(core.stats().dropped) == {"stale": 2}
    assert dict(make_core(max_staleness=2).stats().dropped) == {"stale": 2}


def test_redelivery_after_trainer_and_buffer_restart(make_core: Factory) -> None:
    core = make_core()
    gids = [claim_one(core) for _ in range(3)]
    for gid in gids:
        core.put(group(gid, 2), 0)
    first = core.get_batch(0, 2, 0, 0)
    again = core.get_batch(0, 2, 0, 0)                    # the trainer restarted before committing step 0
    assert again.redelivered and again.samples == first.samples
    core = make_core()                                    # so did the buffer
    third = core.get_batch(0, 2, 0, 0)
    assert third.redelivered and third.samples == first.samples and third.group_ids == gids[:2]
    assert core.get_batch(1, 1, 0, 0).group_ids == [gids[2]]
    assert core.ack(0) == 4
    with pytest.raises(StepCommitted):
        core.get_batch(0, 2, 0, 0)
    assert make_core().get_batch(1, 1, 0, 0).redelivered


def test_lease_expiry_requeues_the_same_prompt(make_core: Factory) -> None:
    now = [1000.0]
    core = make_core(clock=lambda: now[0], lease_seconds=10.0, capacity=5)
    a, b = claim_one(core, replica="dead"), claim_one(core, replica="dead")
    core.put([make_sample(a, 0, 2)], 0)
    assert core.stats().tickets_in_flight == 2
    assert "capacity" in core.claim("live", 0, 1, 0).reason
    now[0] += 11.0
    core = make_core(clock=lambda: now[0], lease_seconds=10.0, capacity=5)   # survives a restart too
    assert core.stats().tickets_in_flight == 0
    res = core.claim("live", 0, 2, 0)
    assert [(t.group_id, t.prompt_index) for t in res.tickets] == [(a, 0), (b, 1)]
    assert counts(core.put(group(a, 2), 0)) == (1, 1, 0)             # the dead replica's sample was kept
    assert core.stats().next_prompt_index == 2


def test_failed_aborted_and_min_valid(make_core: Factory) -> None:
    core = make_core(group_size=4, min_valid_per_group=2)
    ok, bad = claim_one(core), claim_one(core)
    core.put([make_sample(ok, 0, 4, status=FAILED), make_sample(ok, 1, 4, status=ABORTED),
              make_sample(ok, 2, 4), make_sample(ok, 3, 4)], 0)
    core.put([make_sample(bad, i, 4, status=FAILED if i else COMPLETED) for i in range(4)], 0)
    batch = core.get_batch(0, 1, 0, 0)
    assert [sample_pb2.Sample.FromString(d).index for d in batch.samples] == [2, 3]
    assert dict(core.stats().dropped) == {"failed": 5, "aborted": 1}
    assert core.stats().ready_groups == 0
    assert claim_one(core) == "g2"                        # a dropped group frees its place


def test_filters_builtin_and_dotted_path(make_core: Factory) -> None:
    core = make_core(filters=("dynamic_sampling", "tests.integration.test_buffer_contract:drop_prompt_one"))
    a, b, c = claim_one(core), claim_one(core), claim_one(core)
    core.put(group(a, 2, reward=1.0), 0)                  # all equal: DAPO drops it
    core.put(group(b, 2), 0)                              # prompt 1: the user filter drops it
    core.put(group(c, 2), 0)
    assert core.get_batch(0, 1, 0, 0).group_ids == [c]
    assert dict(core.stats().dropped) == {"filtered": 4}


def test_put_back_pressure_waits_for_the_consumer(make_core: Factory) -> None:
    core = make_core(capacity=6)
    a, b, c = (claim_one(core) for _ in range(3))
    core.put(group(a, 2), 0)
    core.put(group(b, 2), 0)
    core = make_core(capacity=4)                           # restarted with less room: 4 stored, full
    with pytest.raises(BufferFull):
        core.put([make_sample(c, 0, 2)], 0)
    order: list[str] = []
    putter = threading.Thread(target=lambda: order.append(f"put {core.put([make_sample(c, 0, 2)], 30).accepted}"))
    putter.start()
    core.get_batch(0, 1, 0, 0)
    order.append("got")
    putter.join()
    assert order == ["got", "put 1"]


def test_claim_back_pressure_paces_the_producer(make_core: Factory) -> None:
    steps, core = 8, make_core(capacity=4, steps=8)
    reasons: list[str] = []

    def produce() -> None:
        while True:
            res = core.claim("r0", 0, 4, 30)
            if res.finished or not res.tickets:
                reasons.append(res.reason)
                if res.finished or "claimed" in res.reason:
                    return
            for t in res.tickets:
                core.put(group(t.group_id, 2), 30)

    producer = threading.Thread(target=produce)
    producer.start()
    issued_before_get = []
    for step in range(steps):
        expect = min(steps, step + 2)                      # room for exactly 2 groups of 2 beyond those consumed
        end = time.monotonic() + 30
        while core.stats().next_prompt_index < expect and time.monotonic() < end:
            time.sleep(0.02)
        issued_before_get.append(core.stats().next_prompt_index)
        assert core.get_batch(step, 1, 0, 30).complete
        core.ack(step)
    producer.join(30)
    assert issued_before_get == [min(steps, s + 2) for s in range(steps)]
    assert core.stats().finished and core.stats().acked_samples == 2 * steps
    assert any("capacity" in r for r in reasons) or core.stats().next_prompt_index == steps


def test_metrics_follow_the_state(make_core: Factory) -> None:
    from prometheus_client import CollectorRegistry

    from rlfleet.runtime.metrics import BufferMetrics

    core = make_core(max_staleness=0)
    registry = CollectorRegistry()
    core.metrics = BufferMetrics(registry)
    a, b = claim_one(core), claim_one(core, version=1)
    core.put([make_sample(a, 0, 2), make_sample(a, 1, 2, status=FAILED)], 0)
    core.put(group(b, 2, version=1), 0)
    core.get_batch(0, 1, 1, 0)                            # a is stale under policy 1

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("rlfleet_buffer_put_samples_total") == 4
    assert value("rlfleet_buffer_dropped_samples_total", reason="failed") == 1
    assert value("rlfleet_buffer_dropped_samples_total", reason="stale") == 1
    assert value("rlfleet_buffer_delivered_samples_total") == 2
    assert value("rlfleet_buffer_policy_version") == 1 and value("rlfleet_buffer_depth") == 0


def test_redis_groups_read_by_a_dead_consumer_are_queued_again(redis_server: RedisServer) -> None:
    prefix = f"test{next(_prefixes)}"
    settings = BufferSettings(capacity=64, group_size=2, groups_per_step=1, min_valid_per_group=1, max_staleness=9)
    core = BufferCore(RedisStore(redis_server.url, prefix=prefix), settings)
    gids = [claim_one(core) for _ in range(2)]
    for gid in gids:
        core.put(group(gid, 2), 0)
    core.close()
    dead = RedisStore(redis_server.url, prefix=prefix)     # read without recording a batch, then die
    dead.r.xreadgroup("trainer", "someone", {dead.k["ready"]: ">"}, count=1)
    dead.close()
    core = BufferCore(RedisStore(redis_server.url, prefix=prefix), settings)
    assert core.stats().ready_groups == 2
    assert core.get_batch(0, 2, 0, 0).group_ids == [gids[1], gids[0]]   # the orphan went to the back
    core.close()
    core = BufferCore(RedisStore(redis_server.url, prefix=prefix), settings)
    assert core.get_batch(0, 2, 0, 0).redelivered
    core.close()


@pytest.mark.parametrize("info_every_commit", [False, True])
def test_redis_restart_between_calls_is_noticed_and_state_reloaded(redis_server: RedisServer,
                                                                    info_every_commit: bool) -> None:
    settings = BufferSettings(capacity=64, group_size=2, groups_per_step=1, min_valid_per_group=1, max_staleness=9)
    store = RedisStore(redis_server.url, prefix=f"test{next(_prefixes)}", info_every_commit=info_every_commit)
    core = BufferCore(store, settings)
    gid = claim_one(core)
    core.put(group(gid, 2), 0)
    redis_server.restart()                                # kill -9, AOF replayed
    with pytest.raises(StoreError):
        core.claim("r0", 0, 1, 0)                         # a dead socket or a new run_id: never trust memory
    assert core.get_batch(0, 1, 0, 0).group_ids == [gid]
    cursor = core.stats().next_prompt_index              # 2 if the failed call reached Redis, else 1
    assert cursor in (1, 2) and claim_one(core) == f"g{cursor}"
    core.close()


# ---- over-sampling and cancellation ---------------------------------------------------------------------------------

def claim_all(core: BufferCore, version: int, replica: str = "r0") -> list[str]:
    return [t.group_id for t in core.claim(replica, version, 64, 0).tickets]


def test_over_sample_issues_more_groups_than_a_step_needs(make_core: Factory) -> None:
    core = make_core(max_staleness=0, groups_per_step=2, over_sample=2.0)
    assert claim_all(core, 0) == ["g0", "g1", "g2", "g3"]              # ceil(2.0 * 2) for step 0, up front
    assert "staleness" in core.claim("r0", 0, 1, 0).reason              # the 5th would feed step 1
    core = make_core(max_staleness=1, groups_per_step=2, over_sample=1.5)    # restarted: asynchronous, 3 a step
    assert claim_all(core, 0) == ["g4", "g5"]                           # with g0..g3: 3 for step 0, 3 for step 1
    assert "staleness" in core.claim("r0", 0, 1, 0).reason


def test_full_batch_cancels_unusable_groups_in_flight(make_core: Factory) -> None:
    from prometheus_client import CollectorRegistry

    from rlfleet.runtime.metrics import BufferMetrics

    core = make_core(max_staleness=0, groups_per_step=2, over_sample=2.0, steps=3, filters=("dynamic_sampling",))
    registry = CollectorRegistry()
    core.metrics = BufferMetrics(registry)
    assert claim_all(core, 0, "r0") == ["g0", "g1", "g2", "g3"] and claim_all(core, 0, "r1") == []
    core.put(group("g0", 2), 0)
    core.put(group("g1", 2, reward=1.0), 0)                             # all equal: filtered, its place is free
    core.put(group("g2", 2), 0)
    core.put([make_sample("g3", 0, 2)], 0)                              # still generating its second sample
    assert claim_all(core, 0, "r1") == ["g4"]                           # replaces the filtered g1
    batch = core.get_batch(0, 2, 0, 0)
    assert batch.group_ids == ["g0", "g2"]
    # g3 and g4 were claimed under version 0; step 1 needs version 1: both are cancelled, each replica told
    assert core.claim("r0", 0, 0, 0).cancelled == ["g3"] and core.claim("r1", 0, 0, 0).cancelled == ["g4"]
    s = core.stats()
    assert (s.cancelled_groups, s.tickets_in_flight, dict(s.dropped)) == (2, 0, {"filtered": 2, "aborted": 1})
    late = core.put(group("g3", 2), 0)
    assert counts(late) == (0, 1, 1)                                    # the late sample: dropped, not stored
    assert late.outcomes == (buffer_pb2.PUT_DUPLICATE, buffer_pb2.PUT_CANCELLED)   # g3/0 was counted already
    assert counts(core.put(group("g4", 2), 0)) == (0, 0, 2)
    assert counts(core.put([make_sample("g4", 1, 2)], 0)) == (0, 1, 0)   # counted once per index
    assert core.stats().stored_samples == 0 and dict(core.stats().dropped)["aborted"] == 4
    assert registry.get_sample_value("rlfleet_buffer_dropped_samples_total", {"reason": "aborted"}) == 4
    core = make_core(max_staleness=0, groups_per_step=2, over_sample=2.0, steps=3)   # a buffer restart keeps them
    assert core.claim("r0", 0, 0, 0).cancelled == ["g3"]
    assert counts(core.put(group("g3", 2), 0)) == (0, 2, 0)
    assert (core.stats().cancelled_groups, dict(core.stats().dropped)["aborted"]) == (2, 4)
    assert claim_all(core, 1, "r0") == ["g5", "g6", "g7", "g8"]         # step 1's share, under version 1


def test_complete_surplus_waits_for_the_next_step_and_async_keeps_usable_groups(make_core: Factory) -> None:
    core = make_core(max_staleness=1, groups_per_step=1, over_sample=2.0, steps=4)
    assert claim_all(core, 0) == ["g0", "g1", "g2", "g3"]               # steps 0 and 1, two each, on version 0
    core.put(group("g0", 2), 0)
    core.put(group("g1", 2), 0)
    assert core.get_batch(0, 1, 0, 0).group_ids == ["g0"]
    assert core.stats().cancelled_groups == 0                           # g2, g3 (version 0) may still feed step 1
    assert core.get_batch(1, 1, 1, 0).group_ids == ["g1"]               # the surplus, not stale under version 1
    assert core.claim("r0", 0, 0, 0).cancelled == ["g2", "g3"]          # step 2 needs version 1: cancelled now
    assert core.stats().tickets_in_flight == 0


def test_no_group_in_flight_survives_the_last_step(make_core: Factory) -> None:
    core = make_core(max_staleness=5, groups_per_step=1, over_sample=3.0, steps=1)
    assert claim_all(core, 0) == ["g0", "g1", "g2"]
    core.put(group("g1", 2), 0)
    assert core.get_batch(0, 1, 0, 0).group_ids == ["g1"]
    assert core.claim("r0", 0, 0, 0).cancelled == ["g0", "g2"]


def test_a_replica_waiting_in_claim_learns_of_a_cancellation_at_once(make_core: Factory) -> None:
    core = make_core(max_staleness=0, groups_per_step=1, over_sample=2.0)
    assert claim_all(core, 0) == ["g0", "g1"]
    core.put(group("g0", 2), 0)
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(core.claim("r0", 0, 0, 600)))   # every slot busy: polls
    waiter.start()
    time.sleep(0.2)
    assert got == []                                                    # nothing to report yet: it waits
    core.get_batch(0, 1, 0, 0)
    waiter.join(60)
    assert not waiter.is_alive() and got[0].cancelled == ["g1"] and not got[0].tickets


def test_ledger_every_issued_group_is_delivered_or_dropped_with_a_reason(make_core: Factory) -> None:
    """Two replicas, sync RL, over_sample 2, DAPO's filter dropping about half the groups, some groups slow."""
    import random

    rng = random.Random(7)
    steps, gps, size = 6, 2, 2
    core = make_core(max_staleness=0, groups_per_step=gps, over_sample=2.0, steps=steps, group_size=size,
                     capacity=256, filters=("dynamic_sampling",))
    delivered: list[str] = []
    equal: set[str] = set()
    cancelled: set[str] = set()
    slow: list[tuple[str, int]] = []                                    # (group, the version it was claimed under)
    for step in range(steps):
        for _ in range(50):                                             # rollout until the step's batch is full
            for gid, v in slow:                                         # last round's slow groups finish now
                core.put(group(gid, size, version=v), 0)
            slow.clear()
            for replica in ("r0", "r1"):
                for gid in (t.group_id for t in core.claim(replica, step, 2, 0).tickets):
                    if rng.random() < 0.25:
                        slow.append((gid, step))                        # put later, after its step may be over
                        core.put([make_sample(gid, 0, size, version=step)], 0)
                        continue
                    flat = rng.random() < 0.5
                    if flat:
                        equal.add(gid)
                    core.put(group(gid, size, reward=1.0 if flat else None, version=step), 0)
            batch = core.get_batch(step, gps, step, 0)
            if batch.complete:
                break
        assert batch.complete, f"step {step} never filled"
        delivered += batch.group_ids
        core.ack(step)
        for replica in ("r0", "r1"):
            cancelled.update(core.claim(replica, step, 0, 0).cancelled)
    for gid, v in slow:                                                 # the last ones finish after the run
        core.put(group(gid, size, version=v), 0)
    s = core.stats()
    issued = {f"g{i}" for i in range(s.next_prompt_index)}
    filtered = equal - cancelled
    unused = issued - set(delivered) - filtered - cancelled             # complete, never trained: stale or left over
    assert s.finished and len(delivered) == len(set(delivered)) == steps * gps
    assert s.ready_groups == 0 and s.tickets_in_flight == 0 and s.stored_samples == 0   # nothing left in between
    assert set(delivered) | filtered | cancelled | unused == issued and not set(delivered) & (filtered | cancelled)
    assert len(issued) > steps * gps and cancelled and filtered         # over-sampled, and both drops happened
    dropped = dict(s.dropped)
    assert set(dropped) <= {"filtered", "aborted", "stale"} and dropped["filtered"] == size * len(filtered)
    assert dropped["aborted"] + dropped.get("stale", 0) == size * (len(cancelled) + len(unused))
    assert dropped["aborted"] >= size * len(cancelled)                 # every sample of a cancelled group, once
    assert s.cancelled_groups == len(cancelled) and s.acked_samples == size * steps * gps


def test_rejected_groups_are_quarantined_for_good_and_the_rest_are_ready_again(make_core: Factory) -> None:
    """Buffer.Reject: the named groups of a delivered batch leave with a reason, the batch's others are ready again,
    the step gets a fresh batch, and a restarted buffer (after a compaction too) never delivers the rejected ones."""
    core = make_core(groups_per_step=2)
    gids = [claim_one(core) for _ in range(4)]
    for gid in gids:
        core.put(group(gid, 2), 0)
    first = core.get_batch(0, 2, 0, 0)
    assert first.group_ids == gids[:2]
    with pytest.raises(InvalidRequest):
        core.reject(0, [gids[2]], "not in the batch")
    with pytest.raises(InvalidRequest):
        core.reject(0, [gids[0]], " ")                       # a reason is required
    res = core.reject(0, [gids[0]], "sample g0/1 has 9000 tokens, over trainer.max_seq_len 64")
    assert (res.quarantined_groups, res.quarantined_samples, res.requeued_groups) == (1, 2, 1)
    assert core.reject(0, [gids[0]], "retried") == type(res)(0, 0, 0)     # a retried call changes nothing
    s = core.stats()
    assert (s.quarantined_groups, s.dropped["quarantined"], s.ready_groups, s.delivered_unacked) == (1, 2, 3, 0)
    assert dict(s.quarantine_reasons) == {"sample g0/1 has 9000 tokens, over trainer.max_seq_len 64": 1}
    again = core.get_batch(0, 2, 0, 0)                        # a fresh batch: the oldest ready, the requeued last
    assert not again.redelivered and again.group_ids == [gids[2], gids[3]]
    core = make_core(groups_per_step=2)                       # restarted: the quarantine holds, the batch too
    assert core.get_batch(0, 2, 0, 0).group_ids == [gids[2], gids[3]]
    assert core.stats().quarantined_groups == 1
    assert core.reject(0, [], "the whole batch") == type(res)(2, 4, 0)
    assert core.stats().ready_groups == 1
    if isinstance(core.store, EmbeddedStore):
        core.store.compact(core.state)                        # a snapshot keeps the records too
    core = make_core(groups_per_step=1)
    assert core.stats().quarantined_groups == 3 and core.stats().dropped["quarantined"] == 6
    assert core.get_batch(0, 1, 0, 0).group_ids == [gids[1]]
    assert counts(core.put(group(gids[0], 2), 0)) == (0, 2, 0)   # a late put of a quarantined group: ignored
    assert core.ack(0) == 2 and core.stats().stored_samples == 0
