"""A broken update never reaches the engine: a truncated broadcast stream, a NIXL trainer peer that dies
mid-transfer, and a corrupted delta file each leave the replica on its previous version with a clear error."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterator
from multiprocessing.context import SpawnProcess
from pathlib import Path

import pytest
import torch

from rlfleet.runtime.rpc import Server, channel
from rlfleet.services.rollout.weight_updates import WeightUpdater
from rlfleet.services.weight_sync.board import VersionBoard
from rlfleet.services.weight_sync.servicer import WeightSyncServicer
from rlfleet.services.weight_sync.transports.bucketed.sender import stage_tensors
from rlfleet.services.weight_sync.transports.contract import Sender
from rlfleet.services.weight_sync.transports.manifest import digest_of
from rlfleet.services.weight_sync.transports.nixl.agent import available as nixl_missing
from rlfleet.services.weight_sync.transports.peers import PeerDirectory
from rlfleet.v1 import weight_sync_pb2_grpc, weights_pb2
from tests.support.requires import requires

torch.set_num_threads(1)
BUCKET = 1024
NIXL_MISSING = nixl_missing()


def tensors(version: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(version)
    return [("a.weight", torch.randn(40, 30, generator=g)), ("b.weight", torch.randn(64, generator=g).bfloat16()),
            ("c.weight", torch.randn(20, 20, generator=g))]


class DictEngine:
    """Plain tensors behind what WeightUpdater needs of an engine (a WeightLoadTarget). Not Pausable: WeightUpdater
    loads it unpaused."""

    def __init__(self, named: list[tuple[str, torch.Tensor]]) -> None:
        self.held = {n: t.clone() for n, t in named}
        self.weight_version = 0

    def update_weights_from_tensor(self, named: list[tuple[str, torch.Tensor]], version: int) -> None:
        for n, t in named:
            self.held[n].copy_(t)
        self.weight_version = version

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.held.items())

    def tied_aliases(self) -> None:
        return None


def manifest_as(transport: str, version: int) -> weights_pb2.WeightManifest:
    m = stage_tensors(version, version, tensors(version), BUCKET, "unused:0").manifest
    m.transport = transport
    return m


class ControlPlane:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        from rlfleet.runtime.metrics import WeightSyncMetrics

        self.board = VersionBoard()
        self.server = Server("127.0.0.1:0", None)
        self.server.add(weight_sync_pb2_grpc.add_WeightSyncServicer_to_server,
                        WeightSyncServicer(self.board, WeightSyncMetrics(CollectorRegistry())), "rlfleet.v1.WeightSync")
        self.server.start()
        self.address = f"127.0.0.1:{self.server.port}"
        self.chan = channel(self.address, None)
        self.directory = PeerDirectory(self.chan)

    def close(self) -> None:
        self.chan.close()
        self.board.close()
        self.server.stop(0)


def _dying(named: list[tuple[str, torch.Tensor]], after: int) -> Iterator[tuple[str, torch.Tensor]]:
    time.sleep(5.0)                                # let the replica finish joining (the store dies with this process)
    for i, item in enumerate(named):
        if i == after:
            os._exit(3)                            # the trainer dies mid-transfer, between two buckets
        yield item


def _dying_trainer(kind: str, address: str) -> None:
    from rlfleet.services.weight_sync.transports.bucketed.sender import BucketedSender

    torch.set_num_threads(1)
    directory = PeerDirectory(channel(address, None))
    named = tensors(1)
    sender: Sender
    if kind == "broadcast":
        from rlfleet.services.weight_sync.transports.broadcast.sender import BroadcastSender

        sender = BroadcastSender(BucketedSender("127.0.0.1:0", None, BUCKET), directory.register, 1, join_seconds=120)
    else:
        from rlfleet.services.weight_sync.transports.nixl.sender import NixlSender

        sender = NixlSender(directory.peers, BUCKET, expected_replicas=1, wait_seconds=120)
    sender.stage(1, 1, _dying(named, after=2))


def _run_dying(kind: str, address: str) -> SpawnProcess:
    proc = multiprocessing.get_context("spawn").Process(target=_dying_trainer, args=(kind, address))
    proc.start()
    return proc


def _assert_kept_previous(updater: WeightUpdater, engine: DictEngine, before: dict[str, torch.Tensor],
                          result: weights_pb2.UpdateResult, words: str) -> None:
    assert not result.ok and result.version == 0 and engine.weight_version == 0
    assert words in result.error, result.error
    assert all(torch.equal(engine.held[n], t) for n, t in before.items())
    assert updater.failures == 1


@pytest.mark.timeout(300)
def test_truncated_broadcast_stream_keeps_previous_version() -> None:
    from rlfleet.services.weight_sync.transports.broadcast.receiver import BroadcastReceiver

    plane = ControlPlane()
    try:
        receiver = BroadcastReceiver(plane.directory.peers, join_seconds=120)
        proc = _run_dying("broadcast", plane.address)
        assert receiver.wait_joined(240), receiver.dead
        proc.join(240)
        assert proc.exitcode == 3
        engine = DictEngine(tensors(0))
        before = {n: t.clone() for n, t in engine.held.items()}
        updater = WeightUpdater(engine, "r0", None, 10.0, receivers=lambda t: receiver.fetch)
        result = updater.apply(manifest_as("broadcast", 1))
        _assert_kept_previous(updater, engine, before, result, "broadcast stream truncated after")
    finally:
        plane.close()


@pytest.mark.timeout(300)
@requires(f"nixl does not import: {NIXL_MISSING} (pip install nixl)" if NIXL_MISSING else None)
def test_nixl_peer_dying_mid_transfer_keeps_previous_version() -> None:
    from rlfleet.services.weight_sync.transports.nixl.receiver import NixlReceiver

    plane = ControlPlane()
    try:
        capacity = stage_tensors(1, 1, tensors(1), BUCKET, "x:0").layout.total_bytes
        receiver = NixlReceiver("r0", capacity, plane.directory.register)
        proc = _run_dying("nixl", plane.address)
        proc.join(240)
        assert proc.exitcode == 3
        engine = DictEngine(tensors(0))
        before = {n: t.clone() for n, t in engine.held.items()}
        updater = WeightUpdater(engine, "r0", None, 2.0, receivers=lambda t: receiver.fetch)
        result = updater.apply(manifest_as("nixl", 1))
        _assert_kept_previous(updater, engine, before, result, "trainer peer died or stalled mid-transfer")
        receiver.close()
    finally:
        plane.close()


@pytest.mark.parametrize("encoding", ["xor", "overwrite"])
def test_corrupted_delta_file_keeps_previous_version(tmp_path: Path, encoding: str) -> None:
    from rlfleet.services.weight_sync.transports.disk_delta.files import DATA, version_dir
    from rlfleet.services.weight_sync.transports.disk_delta.receiver import DeltaReceiver
    from rlfleet.services.weight_sync.transports.disk_delta.sender import DeltaSender

    sender = DeltaSender(tmp_path / "d", encoding)
    v1 = sender.stage(1, 1, tensors(0))
    changed = [(n, t.clone()) for n, t in tensors(0)]
    changed[0][1][3, :5] += 1.0
    v2 = sender.stage(2, 2, changed)
    engine = DictEngine(tensors(0))
    engine.weight_version = 1
    before = {n: t.clone() for n, t in engine.held.items()}
    receiver = DeltaReceiver(lambda: (engine.weight_version, dict(engine.named_weights())))
    path = version_dir(tmp_path / "d", 2) / DATA
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    updater = WeightUpdater(engine, "r0", None, 5.0, receivers=lambda t: receiver.fetch)
    result = updater.apply(v2)
    assert not result.ok and engine.weight_version == 1 and "checksum mismatch" in result.error, result.error
    assert "file corrupted" in result.error
    assert all(torch.equal(engine.held[n], t) for n, t in before.items())
    assert v1.digest != v2.digest
    # a replica that never held v1 rebuilds from the base; both follow the chain only through intact files
    fresh = DictEngine(tensors(5))
    got = DeltaReceiver(lambda: (0, dict(fresh.named_weights()))).fetch(v1, None, 5.0)
    assert digest_of(got) == v1.digest


def test_broadcast_replica_outside_the_group_uses_the_grpc_stream() -> None:
    """A replica that was not there when the group formed fetches the same bytes over gRPC, waits in the next
    generation, and the next version reaches it through the group."""
    from rlfleet.services.weight_sync.transports.broadcast.receiver import BroadcastReceiver
    from rlfleet.services.weight_sync.transports.broadcast.sender import BroadcastSender
    from rlfleet.services.weight_sync.transports.bucketed.sender import BucketedSender

    plane = ControlPlane()
    sender = BroadcastSender(BucketedSender("127.0.0.1:0", None, BUCKET), plane.directory.register, 1,
                             join_seconds=0.1)
    try:
        manifest = sender.stage(1, 1, tensors(1))               # nobody joined: fallback only
        assert manifest.options["fallback"] == "bucketed" and sender.members == 0
        receiver = BroadcastReceiver(plane.directory.peers, join_seconds=10)
        deadline = time.monotonic() + 60
        while sender.waiting < 1:
            assert time.monotonic() < deadline, "the late replica did not wait for the next generation"
            time.sleep(0.05)
        got = receiver.fetch(manifest, None, 30.0, "late")
        assert digest_of(got) == manifest.digest and receiver.from_stream == 1
        m2 = sender.stage(2, 2, tensors(2))
        assert m2.options == {"members": "1", "generation": "1"}
        assert digest_of(receiver.fetch(m2, None, 30.0, "late")) == m2.digest and receiver.from_group == 1
    finally:
        sender.close()
        plane.close()

