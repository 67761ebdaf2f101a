"""Store faults seen from outside: a full disk turns the buffer's health NOT_SERVING until space returns; a second
Redis writer (a zombie buffer across a partition) is fenced by the writer epoch and exits."""

from __future__ import annotations

import resource
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.runtime.rpc import channel
from rlfleet.services.buffer.core import BufferCore
from rlfleet.services.buffer.settings import BufferSettings
from rlfleet.services.buffer.stores import Superseded
from rlfleet.services.buffer.stores.logfile import scan
from rlfleet.services.buffer.stores.redis_streams import RedisStore
from rlfleet.v1 import buffer_pb2, buffer_pb2_grpc
from tests.integration.test_buffer_contract import make_sample
from tests.integration.test_buffer_service import TOKEN, BufferProcess, write_config
from tests.support.redis_server import RedisServer, free_port


def health(address: str) -> int:
    with channel(address, None) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status


def wait_for(predicate: object, timeout: float = 15.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.1)


def test_a_full_disk_makes_the_buffer_not_serving_until_space_returns(tmp_path: Path) -> None:
    port = free_port()
    proc = BufferProcess(write_config(tmp_path / "run", port), port).start()
    assert proc.proc is not None
    try:
        stub = proc.stub()
        tickets = stub.Claim(buffer_pb2.ClaimRequest(replica_id="r", max_groups=2), timeout=10).tickets
        stub.Put(buffer_pb2.PutRequest(samples=[make_sample(tickets[0].group_id, 0, 2)]), timeout=10)
        log = tmp_path / "run" / "buffer" / "buffer.log"
        # the disk fills: the buffer's writes past the log's last commit fail (RLIMIT_FSIZE on the live process;
        # the file goes on with zeros the buffer wrote ahead, where the log ends its scan)
        hard = resource.prlimit(proc.proc.pid, resource.RLIMIT_FSIZE)[1]
        resource.prlimit(proc.proc.pid, resource.RLIMIT_FSIZE, (scan(log).end, hard))
        with pytest.raises(grpc.RpcError) as err:
            stub.Put(buffer_pb2.PutRequest(samples=[make_sample(tickets[0].group_id, 1, 2)]), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "buffer log" in err.value.details()
        wait_for(lambda: health(proc.address) == health_pb2.HealthCheckResponse.NOT_SERVING)
        resource.prlimit(proc.proc.pid, resource.RLIMIT_FSIZE, (hard, hard))     # space returns
        wait_for(lambda: health(proc.address) == health_pb2.HealthCheckResponse.SERVING)
        reply = stub.Put(buffer_pb2.PutRequest(samples=[make_sample(tickets[0].group_id, 1, 2)]), timeout=10)
        assert reply.accepted == 1
        batch = stub.GetBatch(buffer_pb2.GetBatchRequest(step=0, num_groups=1, wait_seconds=5), timeout=10)
        assert batch.complete and [s.index for s in batch.samples] == [0, 1]
        assert proc.terminate() == 0
    finally:
        if proc.proc.poll() is None:
            proc.kill9()


@pytest.fixture()
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


SETTINGS = BufferSettings(capacity=64, group_size=2, groups_per_step=1, steps=100, max_staleness=100,
                          lease_seconds=60.0, min_valid_per_group=1)


def keys_dump(url: str) -> dict[bytes, object]:
    r = redis.Redis.from_url(url)
    out: dict[bytes, object] = {}
    for key in r.keys("fence:*"):
        kind = r.type(key)
        out[key] = (r.hgetall(key) if kind == b"hash" else r.xrange(key) if kind == b"stream" else r.get(key))
    r.close()
    return out


def test_a_superseded_redis_writer_applies_nothing(redis_server: RedisServer) -> None:
    zombie = BufferCore(RedisStore(redis_server.url, prefix="fence:buf"), SETTINGS)
    (t,) = zombie.claim("r", 0, 1, 0).tickets
    zombie.put([make_sample(t.group_id, 0, 2)], 0)
    fresh = BufferCore(RedisStore(redis_server.url, prefix="fence:buf"), SETTINGS)    # takes the next epoch
    (t2,) = fresh.claim("r2", 0, 1, 0).tickets
    before = keys_dump(redis_server.url)
    with pytest.raises(Superseded, match="superseded"):
        zombie.put([make_sample(t.group_id, 1, 2)], 0)        # would close g0 and collide with the fresh seq
    with pytest.raises(Superseded):
        zombie.claim("r", 0, 1, 0)
    assert zombie.superseded.is_set() and not zombie.healthy()
    assert keys_dump(redis_server.url) == before                # not one command of the zombie's commits applied
    fresh.put([make_sample(t.group_id, 1, 2), *[make_sample(t2.group_id, i, 2) for i in range(2)]], 0)
    assert sorted(fresh.state.ready) == ["g0", "g1"] and fresh.healthy()
    fresh.close()
    zombie.close()


def test_a_superseded_buffer_process_exits(tmp_path: Path, redis_server: RedisServer) -> None:
    port = free_port()
    cfg = write_config(tmp_path / "run", port, store="redis", redis_url=redis_server.url)
    proc = BufferProcess(cfg, port).start()
    assert proc.proc is not None
    try:
        proc.stub().Claim(buffer_pb2.ClaimRequest(replica_id="r", max_groups=1), timeout=10)
        newer = RedisStore(redis_server.url, prefix="rlfleet:t:buffer")
        newer.load()                                             # a second buffer takes the store over
        with pytest.raises(grpc.RpcError) as err:
            proc.stub().Claim(buffer_pb2.ClaimRequest(replica_id="r", max_groups=1), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "superseded" in err.value.details()
        assert proc.proc.wait(timeout=20) == 3
        newer.close()
    finally:
        if proc.proc.poll() is None:
            proc.kill9()


def test_keepalive_fails_a_call_to_a_frozen_server_long_before_its_deadline(tmp_path: Path) -> None:
    """SIGSTOP of the buffer mid-call: the TCP connection stays up, so only HTTP/2 keepalive can tell."""
    port = free_port()
    proc = BufferProcess(write_config(tmp_path / "run", port), port).start()
    assert proc.proc is not None
    try:
        stub = buffer_pb2_grpc.BufferStub(channel(proc.address, TOKEN, keepalive_s=1.0, keepalive_timeout_s=1.0))
        stub.Stats(buffer_pb2.StatsRequest(), timeout=10)
        proc.proc.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            stub.Stats(buffer_pb2.StatsRequest(), timeout=60)
        took = time.monotonic() - t0
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and took < 15, (err.value.code(), took)
    finally:
        proc.proc.send_signal(signal.SIGCONT)
        proc.kill9()
