"""VersionBoard: the control plane's bookkeeping, without gRPC."""

from __future__ import annotations

from rlfleet.services.weight_sync.board import VersionBoard
from rlfleet.services.weight_sync.transports.manifest import manifest_digest
from rlfleet.v1 import weights_pb2


def manifest(version: int) -> weights_pb2.WeightManifest:
    entries = [weights_pb2.TensorEntry(name="w", dtype="float32", xxh64=f"{version:016x}")]
    return weights_pb2.WeightManifest(version=version, transport="bucketed", tensors=entries,
                                      digest=manifest_digest([("w", f"{version:016x}")]))


def ack(board: VersionBoard, replica: str, version: int, digest: str | None = None, ok: bool = True) -> None:
    board.ack(weights_pb2.UpdateResult(replica_id=replica, version=version, ok=ok,
                                       digest=manifest(version).digest if digest is None else digest))


def test_slow_subscriber_gets_the_newest_version_only() -> None:
    board = VersionBoard()
    sub = board.subscribe("r0", have_version=0)
    for v in (1, 2, 3):
        board.publish(manifest(v))
    got = sub.next(1.0)
    assert got is not None and got.version == 3
    assert sub.next(0.05) is None


def test_new_subscriber_gets_latest_only_when_newer_than_what_it_has() -> None:
    board = VersionBoard()
    board.publish(manifest(4))
    got = board.subscribe("r0", have_version=3).next(1.0)
    assert got is not None and got.version == 4
    assert board.subscribe("r1", have_version=4).next(0.05) is None


def test_all_current_means_every_subscribed_replica_serves_the_version() -> None:
    board = VersionBoard()
    assert board.verify(0, 0.0)[:2] == (0, False)                  # nothing published
    board.publish(manifest(1))
    assert board.verify(0, 0.0) == (1, True, [])                   # nobody subscribed: vacuously current
    assert board.verify(7, 0.0)[:2] == (7, False)                  # never published
    sub = board.subscribe("r0", 0)
    assert board.verify(0, 0.0)[:2] == (1, False)
    ack(board, "r0", 1)
    assert board.verify(0, 0.0)[:2] == (1, True)
    board.publish(manifest(2))
    assert board.verify(0, 0.0)[:2] == (2, False)
    assert board.verify(1, 0.0)[:2] == (1, True)                   # an older version stays verifiable
    board.unsubscribe(sub)
    assert board.verify(2, 0.0) == (2, True, [])                   # gone replicas are not listed


def test_failed_update_and_wrong_digest_count_failures() -> None:
    board = VersionBoard()
    board.publish(manifest(1))
    board.subscribe("r0", 0)
    ack(board, "r0", 0, digest="", ok=False)
    ack(board, "r0", 1, digest="ffff")
    _, current, (rep,) = board.verify(1, 0.0)
    assert not current and rep.failures == 2 and not rep.ok and "digest mismatch" in rep.error
    ack(board, "r0", 1)
    _, current, (rep,) = board.verify(1, 0.0)
    assert current and rep.ok and rep.error == "" and rep.failures == 2
