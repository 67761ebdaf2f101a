"""kill -9 of Redis and of the buffer during a stream of puts, gets and acks: nothing lost, nothing twice.

A producer thread claims and puts (each sample in its own Put), a consumer thread gets and acks one group per
step; the test kills the store and the service under them. The ledger then proves every sample whose Put
succeeded was delivered in exactly one acked step, or dropped with its reason (here: status FAILED).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from rlfleet.v1 import buffer_pb2, sample_pb2
from tests.integration.test_buffer_contract import FAILED, make_sample
from tests.integration.test_buffer_service import BufferProcess, write_config
from tests.support.redis_server import RedisServer, free_port

T = TypeVar("T")
STEPS = 16
RETRY = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}


def retry(fn: Callable[[], T], patience: float = 60.0) -> T:
    end = time.monotonic() + patience
    while True:
        try:
            return fn()
        except grpc.RpcError as exc:
            if exc.code() not in RETRY or time.monotonic() > end:
                raise
            time.sleep(0.1)


class Ledger:
    def __init__(self) -> None:
        self.put_ok: set[str] = set()
        self.failed: set[str] = set()
        self.deliveries: dict[int, list[list[str]]] = {}
        self.acked_steps: list[int] = []
        self.errors: list[BaseException] = []


def produce(proc: BufferProcess, ledger: Ledger) -> None:
    while True:
        reply = retry(lambda: proc.stub().Claim(buffer_pb2.ClaimRequest(replica_id="r", max_groups=2,
                                                                        wait_seconds=1), timeout=5))
        if reply.finished:
            return
        for t in reply.tickets:
            for i in range(t.group_size):
                status = FAILED if (t.prompt_index % 4 == 0 and i == 1) else sample_pb2.SAMPLE_STATUS_COMPLETED
                sample = make_sample(t.group_id, i, t.group_size, status=status)
                def put(s: sample_pb2.Sample = sample) -> buffer_pb2.PutReply:
                    return proc.stub().Put(buffer_pb2.PutRequest(samples=[s], wait_seconds=1), timeout=5)

                retry(put)
                key = f"{t.group_id}/{i}"
                (ledger.failed if status == FAILED else ledger.put_ok).add(key)


def consume(proc: BufferProcess, ledger: Ledger) -> None:
    def get_batch(s: int) -> buffer_pb2.Batch:
        return proc.stub().GetBatch(buffer_pb2.GetBatchRequest(step=s, num_groups=1, wait_seconds=1), timeout=5)

    def ack(s: int) -> buffer_pb2.AckReply:
        return proc.stub().Ack(buffer_pb2.AckRequest(committed_step=s), timeout=5)

    for step in range(STEPS):
        end = time.monotonic() + 60
        while True:
            assert time.monotonic() < end, f"no batch for step {step}"
            batch = retry(partial(get_batch, step))
            if batch.complete:
                break
        ledger.deliveries.setdefault(step, []).append([f"{s.group_id}/{s.index}" for s in batch.samples])
        if step % 3 == 2:                                   # a trainer that crashed before committing
            again = retry(partial(get_batch, step))
            assert again.redelivered
            ledger.deliveries[step].append([f"{s.group_id}/{s.index}" for s in again.samples])
        retry(partial(ack, step))
        ledger.acked_steps.append(step)


def guarded(fn: Callable[..., None], ledger: Ledger, *args: object) -> threading.Thread:
    def run() -> None:
        try:
            fn(*args, ledger)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            ledger.errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def wait_for(cond: Callable[[], bool], ledger: Ledger, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not cond() and not ledger.errors:
        assert time.monotonic() < end, "the stream stalled"
        time.sleep(0.05)


@pytest.mark.parametrize("store", ["redis", "embedded"])
def test_kill9_store_and_buffer_nothing_lost(tmp_path: Path, store: str) -> None:
    redis_server = RedisServer(tmp_path / "redis").start() if store == "redis" else None
    extra = {"store": "redis", "redis_url": redis_server.url} if redis_server else {"fsync": "everysec"}
    port = free_port()
    # a Claim whose reply died with the buffer leaves a ticket nobody works on: its lease re-queues it
    cfg = write_config(tmp_path / "run", port, capacity=8, lease_seconds=2.0, **extra)
    cfg.write_text(cfg.read_text().replace("steps: 1000", f"steps: {STEPS}"))
    proc = BufferProcess(cfg, port).start()
    ledger = Ledger()
    try:
        threads = [guarded(produce, ledger, proc), guarded(consume, ledger, proc)]
        wait_for(lambda: len(ledger.acked_steps) >= 4, ledger)
        if redis_server is not None:
            redis_server.kill9()                            # the store dies under the buffer
            time.sleep(0.3)
            redis_server.start()
        else:
            proc.kill9()
            proc.start()
        wait_for(lambda: len(ledger.acked_steps) >= 9, ledger)
        proc.kill9()                                        # then the buffer itself
        proc.start()
        for t in threads:
            t.join(90)
        assert not ledger.errors, ledger.errors
        stats = proc.stub().Stats(buffer_pb2.StatsRequest(), timeout=5)
    finally:
        proc.kill9()
        if redis_server is not None:
            redis_server.stop()

    assert ledger.acked_steps == list(range(STEPS))
    for step, deliveries in ledger.deliveries.items():
        assert all(d == deliveries[0] for d in deliveries), f"step {step} was re-delivered differently"
    delivered = [key for step in range(STEPS) for key in ledger.deliveries[step][0]]
    assert len(delivered) == len(set(delivered)), "a sample was delivered in two steps"
    assert set(delivered) == ledger.put_ok                  # every put sample trained on exactly once ...
    assert dict(stats.dropped) == {"failed": len(ledger.failed)}   # ... or dropped with its reason
    assert stats.finished and stats.acked_samples == len(delivered)
    assert stats.put_samples == len(ledger.put_ok) + len(ledger.failed)
    assert stats.stored_samples == 0 and stats.delivered_unacked == 0
