"""rlfleet.v1.WeightSync over real gRPC (in-process server): Publish, Subscribe, Ack, Verify, auth, metrics."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from prometheus_client import CollectorRegistry

from rlfleet.runtime.metrics import WeightSyncMetrics
from rlfleet.runtime.rpc import Server, channel
from rlfleet.services.weight_sync.board import VersionBoard
from rlfleet.services.weight_sync.servicer import WeightSyncServicer
from rlfleet.services.weight_sync.transports.manifest import manifest_digest
from rlfleet.v1 import weight_sync_pb2, weight_sync_pb2_grpc, weights_pb2

TOKEN = "control-token"


@dataclass
class Control:
    stub: weight_sync_pb2_grpc.WeightSyncStub
    registry: CollectorRegistry
    address: str


@pytest.fixture
def control() -> Iterator[Control]:
    board, registry = VersionBoard(), CollectorRegistry()
    server = Server("127.0.0.1:0", TOKEN)
    server.add(weight_sync_pb2_grpc.add_WeightSyncServicer_to_server,
               WeightSyncServicer(board, WeightSyncMetrics(registry)), "rlfleet.v1.WeightSync")
    server.start()
    address = f"127.0.0.1:{server.port}"
    ch = channel(address, TOKEN)
    yield Control(weight_sync_pb2_grpc.WeightSyncStub(ch), registry, address)
    ch.close()
    board.close()
    server.stop(grace=0)


def manifest(version: int) -> weights_pb2.WeightManifest:
    h = f"{version:016x}"
    return weights_pb2.WeightManifest(version=version, step=version, transport="bucketed", endpoint="127.0.0.1:1",
                                      tensors=[weights_pb2.TensorEntry(name="w", dtype="float32", xxh64=h)],
                                      total_bytes=1000, digest=manifest_digest([("w", h)]))


def ack(c: Control, replica: str, version: int, digest: str | None = None, ok: bool = True) -> None:
    c.stub.Ack(weights_pb2.UpdateResult(replica_id=replica, version=version, ok=ok, bytes=1000,
                                        digest=manifest(version).digest if digest is None else digest), timeout=10)


def subscribe(c: Control, replica: str, have: int = 0) -> grpc.Future:
    return c.stub.Subscribe(weight_sync_pb2.SubscribeRequest(replica_id=replica, have_version=have), timeout=30)


def wait_subscribed(c: Control, n: int) -> None:
    deadline = time.monotonic() + 10
    while len(c.stub.Verify(weight_sync_pb2.VerifyRequest(), timeout=10).replicas) != n:
        assert time.monotonic() < deadline, f"never saw {n} subscribed replicas"
        time.sleep(0.02)


def verify(c: Control, version: int = 0, wait: float = 0.0) -> weight_sync_pb2.VerifyReply:
    return c.stub.Verify(weight_sync_pb2.VerifyRequest(version=version, wait_seconds=wait), timeout=30)


def test_subscribe_gets_latest_then_each_new_manifest(control: Control) -> None:
    control.stub.Publish(manifest(1), timeout=10)
    control.stub.Publish(manifest(2), timeout=10)
    stream = subscribe(control, "r0")
    assert next(stream).version == 2                                   # the latest, at once
    for v in (3, 4):
        assert control.stub.Publish(manifest(v), timeout=10).subscribers == 1
        got = next(stream)
        assert (got.version, got.digest, got.endpoint) == (v, manifest(v).digest, "127.0.0.1:1")
    up_to_date = subscribe(control, "r1", have=4)                      # nothing newer than what it has ...
    control.stub.Publish(manifest(5), timeout=10)
    assert next(up_to_date).version == 5                               # ... so its first message is the next one
    stream.cancel()
    up_to_date.cancel()


def test_verify_all_current_flips_after_every_replica_acks(control: Control) -> None:
    streams = [subscribe(control, r) for r in ("r0", "r1")]
    wait_subscribed(control, 2)
    control.stub.Publish(manifest(1), timeout=10)
    assert not verify(control).all_current
    ack(control, "r0", 1)
    reply = verify(control, 1)
    assert not reply.all_current
    assert {(r.replica_id, r.version, r.ok) for r in reply.replicas} == {("r0", 1, True), ("r1", 0, False)}
    threading.Timer(0.3, ack, (control, "r1", 1)).start()
    reply = verify(control, 0, wait=10)                                # waits for r1's ack
    assert reply.all_current and reply.version == 1
    control.stub.Publish(manifest(2), timeout=10)
    assert not verify(control).all_current
    for s in streams:
        s.cancel()


def test_mismatching_digest_ack_is_not_current_and_counts_a_failure(control: Control) -> None:
    stream = subscribe(control, "r0")
    wait_subscribed(control, 1)
    control.stub.Publish(manifest(1), timeout=10)
    ack(control, "r0", 1, digest="0123456789abcdef")
    reply = verify(control, 1, wait=0.2)
    (rep,) = reply.replicas
    assert not reply.all_current and not rep.ok and rep.failures == 1 and "digest mismatch" in rep.error
    assert control.registry.get_sample_value("rlfleet_weight_sync_failures_total", {"replica": "r0"}) == 1
    ack(control, "r0", 1)
    assert verify(control, 1).all_current
    assert control.registry.get_sample_value("rlfleet_weight_sync_seconds_count", {"transport": "bucketed"}) == 1
    assert control.registry.get_sample_value("rlfleet_weight_sync_bytes_total", {"transport": "bucketed"}) == 1000
    assert control.registry.get_sample_value("rlfleet_weight_sync_replica_version", {"replica": "r0"}) == 1
    assert control.registry.get_sample_value("rlfleet_weight_sync_published_version") == 1
    stream.cancel()


def test_disconnected_subscriber_is_removed(control: Control) -> None:
    keep, leave = subscribe(control, "r0"), subscribe(control, "r1")
    wait_subscribed(control, 2)
    control.stub.Publish(manifest(1), timeout=10)
    ack(control, "r0", 1)
    assert not verify(control).all_current
    leave.cancel()
    wait_subscribed(control, 1)
    assert verify(control).all_current
    assert control.stub.Publish(manifest(2), timeout=10).subscribers == 1
    keep.cancel()


def test_publish_refuses_a_manifest_whose_digest_does_not_match(control: Control) -> None:
    bad = manifest(1)
    bad.digest = "0" * 16
    with pytest.raises(grpc.RpcError) as err:
        control.stub.Publish(bad, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_calls_without_the_run_token_are_unauthenticated(control: Control) -> None:
    with channel(control.address, None) as ch:
        stub = weight_sync_pb2_grpc.WeightSyncStub(ch)
        for call in (lambda: stub.Publish(manifest(1), timeout=10),
                     lambda: next(stub.Subscribe(weight_sync_pb2.SubscribeRequest(replica_id="x"), timeout=10)),
                     lambda: stub.Verify(weight_sync_pb2.VerifyRequest(), timeout=10)):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert verify(control).version == 0                               # nothing was published
