"""Signed weights on every transport: a forged version (an altered tensor whose xxh64 entries and digest the forger
recomputed, so the fast pre-checks pass) and an unsigned version are refused, and the replica keeps serving the
previous version. Real senders and receivers of each data plane, in this process, on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import xxhash

from rlfleet.runtime.rpc import Server, channel
from rlfleet.security.signing import HashingTee, SignatureError, Signer, Verifier, sign_manifest, verify_weights
from rlfleet.services.rollout.weight_updates import WeightUpdater
from rlfleet.services.weight_sync.board import VersionBoard
from rlfleet.services.weight_sync.servicer import WeightSyncServicer
from rlfleet.services.weight_sync.transports.nixl.agent import available as nixl_missing
from rlfleet.services.weight_sync.transports.peers import PeerDirectory
from rlfleet.v1 import weight_sync_pb2_grpc, weights_pb2
from tests.support.requires import missing

torch.set_num_threads(1)
BUCKET = 1024
Fetch = Callable[..., list[tuple[str, torch.Tensor]]]


def tensors(version: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(version)
    return [("a.weight", torch.randn(40, 30, generator=g)), ("b.weight", torch.randn(64, generator=g).bfloat16()),
            ("c.weight", torch.randn(20, 20, generator=g))]


def forged_of(named: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    out = [(n, t.clone()) for n, t in named]
    out[0][1][0, 0] += 1.0                          # one element of one tensor: a planted behaviour change
    return out


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


def _xxh(t: torch.Tensor) -> str:
    return xxhash.xxh64(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


class Plane:
    """A WeightSync control plane (peer directory) on loopback."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        from rlfleet.runtime.metrics import WeightSyncMetrics

        self.board = VersionBoard()
        self.server = Server("127.0.0.1:0", None)
        self.server.add(weight_sync_pb2_grpc.add_WeightSyncServicer_to_server,
                        WeightSyncServicer(self.board, WeightSyncMetrics(CollectorRegistry())), "rlfleet.v1.WeightSync")
        self.server.start()
        self.chan = channel(f"127.0.0.1:{self.server.port}", None)
        self.directory = PeerDirectory(self.chan)

    def close(self) -> None:
        self.chan.close()
        self.board.close()
        self.server.stop(0)


@contextmanager
def bucketed(tmp: Path, engine: DictEngine) -> Iterator[tuple[Callable, Fetch]]:
    from rlfleet.services.weight_sync.transports.bucketed import BucketedSender, fetch

    sender = BucketedSender("127.0.0.1:0", None, BUCKET)
    try:
        yield sender.stage, fetch
    finally:
        sender.close()


@contextmanager
def disk_delta(tmp: Path, engine: DictEngine) -> Iterator[tuple[Callable, Fetch]]:
    from rlfleet.services.weight_sync.transports.disk_delta.receiver import DeltaReceiver
    from rlfleet.services.weight_sync.transports.disk_delta.sender import DeltaSender

    sender = DeltaSender(tmp / "delta", "xor")
    yield sender.stage, DeltaReceiver(lambda: (engine.weight_version, dict(engine.named_weights()))).fetch


@contextmanager
def broadcast(tmp: Path, engine: DictEngine) -> Iterator[tuple[Callable, Fetch]]:
    """The broadcast receiver over its gRPC stream (a replica outside the trainer's group)."""
    from rlfleet.services.weight_sync.transports.broadcast.receiver import BroadcastReceiver
    from rlfleet.services.weight_sync.transports.broadcast.sender import BroadcastSender
    from rlfleet.services.weight_sync.transports.bucketed.sender import BucketedSender

    plane = Plane()
    sender = BroadcastSender(BucketedSender("127.0.0.1:0", None, BUCKET), plane.directory.register, 1,
                             join_seconds=0.1)
    receiver = BroadcastReceiver(plane.directory.peers, join_seconds=10)
    try:
        yield sender.stage, receiver.fetch
    finally:
        sender.close()
        receiver.close()
        plane.close()


@contextmanager
def nixl(tmp: Path, engine: DictEngine) -> Iterator[tuple[Callable, Fetch]]:
    from rlfleet.services.weight_sync.transports.bucketed.sender import stage_tensors
    from rlfleet.services.weight_sync.transports.nixl.receiver import NixlReceiver
    from rlfleet.services.weight_sync.transports.nixl.sender import NixlSender

    plane = Plane()
    capacity = stage_tensors(1, 1, tensors(1), BUCKET, "x:0").layout.total_bytes
    receiver = NixlReceiver("r0", capacity, plane.directory.register)
    sender = NixlSender(plane.directory.peers, BUCKET, expected_replicas=1, wait_seconds=30)
    try:
        yield sender.stage, receiver.fetch
    finally:
        sender.close()
        receiver.close()
        plane.close()


TRANSPORTS = {"bucketed": bucketed, "disk_delta": disk_delta, "broadcast": broadcast, "nixl": nixl}


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Signer, Verifier]:
    from rlfleet.security.signing import generate_signing_key

    d = tmp_path_factory.mktemp("keys")
    generate_signing_key(d / "k", d / "k.pub")
    return Signer.from_file(d / "k"), Verifier.from_file(d / "k.pub")


def _signed(stage: Callable, version: int, named: list[tuple[str, torch.Tensor]],
            signer: Signer) -> weights_pb2.WeightManifest:
    """What the trainer's publisher does: stage through a HashingTee, then sign."""
    tee = HashingTee(named)
    manifest = stage(version, version, tee)
    sign_manifest(manifest, tee.digests, signer)
    return manifest


@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", list(TRANSPORTS))
def test_forged_and_unsigned_versions_are_refused(transport: str, tmp_path: Path,
                                                  keys: tuple[Signer, Verifier]) -> None:
    if transport == "nixl" and nixl_missing() is not None:
        missing(f"nixl does not import: {nixl_missing()}")
    signer, verifier = keys
    engine = DictEngine(tensors(0))
    with TRANSPORTS[transport](tmp_path, engine) as (stage, fetch):
        updater = WeightUpdater(engine, "r0", None, 10.0, receivers=lambda t: fetch, verifier=verifier)
        v1 = _signed(stage, 1, tensors(1), signer)
        assert updater.apply(v1).ok and engine.weight_version == 1
        held = {n: t.clone() for n, t in engine.held.items()}

        # the forger stages altered tensors as version 2: its xxh64 entries and digest match the altered bytes
        forged = stage(2, 2, forged_of(tensors(2)))
        assert [e.xxh64 for e in forged.tensors] == [_xxh(t) for _, t in forged_of(tensors(2))]
        # ... and carries the trainer's signature of the genuine version 2 (same names, shapes, routing)
        genuine = weights_pb2.WeightManifest()
        genuine.CopyFrom(forged)
        tee = HashingTee(tensors(2))
        list(tee)
        sign_manifest(genuine, tee.digests, signer)
        for e, g in zip(forged.tensors, genuine.tensors, strict=True):
            e.blake3 = g.blake3
        forged.signature = genuine.signature
        result = updater.apply(forged)
        assert not result.ok and "does not hash to its signed BLAKE3 digest" in result.error, result.error
        assert engine.weight_version == 1 and all(torch.equal(engine.held[n], t) for n, t in held.items())

        unsigned = weights_pb2.WeightManifest()         # NIXL: each attempt is a fresh transfer into the slot
        unsigned.CopyFrom(stage(2, 2, forged_of(tensors(2))) if transport == "nixl" else forged)
        unsigned.ClearField("signature")
        result = updater.apply(unsigned)
        assert not result.ok and "is unsigned" in result.error, result.error
        assert engine.weight_version == 1 and all(torch.equal(engine.held[n], t) for n, t in held.items())
        assert updater.failures == 2


def test_a_signature_by_another_key_or_over_other_tensors_does_not_verify(keys: tuple[Signer, Verifier],
                                                                         tmp_path: Path) -> None:
    from rlfleet.services.weight_sync.transports.bucketed.sender import stage_tensors

    signer, verifier = keys
    named = tensors(3)
    tee = HashingTee(named)
    manifest = stage_tensors(3, 3, tee, BUCKET, "x:0").manifest
    sign_manifest(manifest, tee.digests, signer)
    verify_weights(manifest, named, verifier)
    from rlfleet.security.signing import generate_signing_key

    generate_signing_key(tmp_path / "other", tmp_path / "other.pub")
    with pytest.raises(SignatureError, match="does not verify"):
        verify_weights(manifest, named, Verifier.from_file(tmp_path / "other.pub"))
    recomputed = weights_pb2.WeightManifest()
    recomputed.CopyFrom(manifest)
    forged = forged_of(named)
    tee2 = HashingTee(forged)
    list(tee2)
    for e in recomputed.tensors:                      # the forger recomputes the BLAKE3 digests too
        e.blake3 = tee2.digests[e.name]
    with pytest.raises(SignatureError, match="does not verify"):
        verify_weights(recomputed, forged, verifier)


def test_the_bucketed_receiver_hashes_a_signed_version_as_it_arrives(keys: tuple[Signer, Verifier]) -> None:
    """A signed version comes back with the BLAKE3 of every tensor computed from the received bytes (tensors that
    span buckets, an empty one), equal to hashing them afterwards; verify_weights uses those digests."""
    from rlfleet.security.signing import HashedTensors, tensor_blake3
    from rlfleet.services.weight_sync.transports.bucketed import BucketedSender, fetch

    signer, verifier = keys
    named = [*tensors(3), ("empty.weight", torch.empty(0, 4)), ("big.weight", torch.randn(3000))]   # 12 KB: 12 buckets
    sender = BucketedSender("127.0.0.1:0", None, BUCKET)
    try:
        manifest = _signed(sender.stage, 3, named, signer)
        assert manifest.num_buckets > 3
        got = fetch(manifest, None, 10.0)
        assert isinstance(got, HashedTensors)
        assert got.blake3 == {n: tensor_blake3(t) for n, t in named} == {e.name: e.blake3 for e in manifest.tensors}
        verify_weights(manifest, got, verifier)
        got.blake3["big.weight"] = "0" * 64                    # what the receiver saw is what is checked
        with pytest.raises(SignatureError, match="big.weight"):
            verify_weights(manifest, got, verifier)
        manifest.ClearField("signature")
        assert not isinstance(fetch(manifest, None, 10.0), HashedTensors)   # unsigned: nothing extra is hashed
    finally:
        sender.close()
