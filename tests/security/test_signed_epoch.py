"""The weight manifest's epoch is signed, and a replica checks the signature before it changes any state or
allocates a byte: whatever relays manifests (the WeightSync board, a LoadWeights caller) can neither pin a replica at
epoch 2^64-1 nor roll it back, through a new version or the "same weights" shortcut. Real bucketed sender and
receiver on loopback, real Ed25519 keys."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlfleet.security.signing import HashingTee, Signer, Verifier, generate_signing_key, sign_manifest
from rlfleet.services.rollout.weight_updates import WeightUpdater
from rlfleet.services.weight_sync.transports.bucketed import BucketedSender, fetch
from rlfleet.services.weight_sync.transports.layout import LayoutError, layout_of
from rlfleet.v1 import weights_pb2
from tests.security.test_signed_weights import BUCKET, DictEngine, tensors

EPOCH = 1_700_000_000_000


@pytest.fixture()
def keys(tmp_path: Path) -> tuple[Signer, Verifier]:
    generate_signing_key(tmp_path / "k", tmp_path / "k.pub")
    return Signer.from_file(tmp_path / "k"), Verifier.from_file(tmp_path / "k.pub")


@pytest.fixture()
def sender() -> Iterator[BucketedSender]:
    s = BucketedSender("127.0.0.1:0", None, BUCKET)
    yield s
    s.close()


class Fetches:
    """The replica's receivers, counting the fetches (each allocates layout.total_bytes before a chunk arrives)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, transport: str) -> Any:
        def counted(*args: Any, **kw: Any) -> Any:
            self.calls += 1
            return fetch(*args, **kw)
        return counted


def _signed(sender: BucketedSender, version: int, signer: Signer, epoch: int = EPOCH) -> weights_pb2.WeightManifest:
    """What the trainer's publisher does: stage through a HashingTee, stamp the epoch, sign."""
    tee = HashingTee(tensors(version))
    manifest = sender.stage(version, version, tee)
    manifest.epoch = epoch
    sign_manifest(manifest, tee.digests, signer)
    return manifest


def _edited(manifest: weights_pb2.WeightManifest, **fields: Any) -> weights_pb2.WeightManifest:
    out = weights_pb2.WeightManifest()
    out.CopyFrom(manifest)
    for name, value in fields.items():
        setattr(out, name, value)
    return out


def _replica(keys: tuple[Signer, Verifier]) -> tuple[DictEngine, WeightUpdater, Fetches]:
    engine, fetches = DictEngine(tensors(0)), Fetches()
    return engine, WeightUpdater(engine, "r0", None, 10.0, receivers=fetches, verifier=keys[1]), fetches


def test_a_manifest_with_an_edited_epoch_is_refused_and_changes_nothing(keys: tuple[Signer, Verifier],
                                                                       sender: BucketedSender) -> None:
    engine, updater, fetches = _replica(keys)
    assert updater.apply(_signed(sender, 1, keys[0])).ok
    assert (engine.weight_version, updater.epoch, fetches.calls) == (1, EPOCH, 1)
    v2 = _signed(sender, 2, keys[0])
    for epoch in (2**64 - 1, EPOCH - 1, 0):           # pinned far ahead, or rolled back
        result = updater.apply(_edited(v2, epoch=epoch))
        assert not result.ok and "does not verify" in result.error, result.error
        assert (engine.weight_version, updater.epoch, updater.epoch_of(2), fetches.calls) == (1, EPOCH, 0, 1)
    assert updater.apply(v2).ok and (engine.weight_version, updater.epoch) == (2, EPOCH)


def test_the_same_weights_shortcut_with_a_forged_epoch_is_refused(keys: tuple[Signer, Verifier],
                                                                  sender: BucketedSender) -> None:
    """The version and digest the replica serves, re-announced with another epoch: no fetch, so no BLAKE3 check;
    the signature alone stands between it and the replica's epoch."""
    engine, updater, fetches = _replica(keys)
    v1 = _signed(sender, 1, keys[0])
    assert updater.apply(v1).ok
    result = updater.apply(_edited(v1, epoch=2**64 - 1))
    assert not result.ok and "does not verify" in result.error
    assert (engine.weight_version, updater.epoch, updater.epoch_of(1)) == (1, EPOCH, EPOCH)
    unsigned = _edited(v1, epoch=EPOCH + 1)
    unsigned.ClearField("signature")
    assert "is unsigned" in updater.apply(unsigned).error and updater.epoch == EPOCH
    later = _signed(sender, 1, keys[0], epoch=EPOCH + 5)  # the trainer's own re-announcement under a new epoch
    assert updater.apply(later).ok and updater.epoch == EPOCH + 5 and fetches.calls == 1


def test_an_unsigned_huge_manifest_is_refused_before_any_allocation(keys: tuple[Signer, Verifier],
                                                                    sender: BucketedSender) -> None:
    """A manifest edited to announce a 4 TiB tensor: refused by its signature, before the receiver is asked to
    fetch (which would allocate layout.total_bytes)."""
    engine, updater, fetches = _replica(keys)
    huge = _signed(sender, 1, keys[0])
    entry = huge.tensors[0]
    entry.shape[:] = [2**40]
    entry.nbytes = 2**42
    huge.bucket_bytes = 2**42
    huge.total_bytes = 2**42
    result = updater.apply(huge)
    assert not result.ok and "does not verify" in result.error
    assert fetches.calls == 0 and engine.weight_version == 0 and updater.failures == 1


def test_unsigned_routing_fields_cannot_inflate_the_receive_buffer(keys: tuple[Signer, Verifier],
                                                                   sender: BucketedSender) -> None:
    """Bucket offsets and counts are not in the signed statement: the layout a receiver allocates for is bounded by
    the signed tensor sizes, so an edited offset or bucket count is a bad manifest, not a huge buffer."""
    v1 = _signed(sender, 1, keys[0])
    assert layout_of(v1).total_bytes <= sum(e.nbytes for e in v1.tensors) + 16 * v1.num_buckets
    far = _edited(v1, bucket_bytes=2**40, num_buckets=1)      # one bucket, the first tensor 512 GiB into it
    for e in far.tensors:
        e.bucket, e.offset = 0, 0
    far.tensors[0].offset = 2**39
    with pytest.raises(LayoutError, match="bytes for"):
        layout_of(far)
    with pytest.raises(LayoutError, match="buckets for"):
        layout_of(_edited(v1, num_buckets=2**32 - 1))
