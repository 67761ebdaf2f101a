"""The control plane's state: published manifests, live subscriptions, and what each replica says it serves.

Thread-safe; no gRPC here. One condition variable guards everything, so Verify can wait for acks.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from rlfleet.v1 import weight_sync_pb2, weights_pb2

KEEP_MANIFESTS = 16   # older versions stay verifiable for a while


def order(manifest: weights_pb2.WeightManifest) -> tuple[int, int]:
    """Versions order by (epoch, version): a resumed trainer's epoch is newer, so its lower numbers win."""
    return (manifest.epoch, manifest.version)


@dataclass
class Published:
    manifest: weights_pb2.WeightManifest
    at: float                       # time.monotonic() of Publish


@dataclass
class Replica:
    replica_id: str
    version: int = 0
    digest: str = ""
    ok: bool = False
    error: str = ""
    last_update: float = 0.0        # time.time() of the last ack
    failures: int = 0
    acked: bool = False


@dataclass(frozen=True)
class AckOutcome:
    ok: bool                        # the replica serves the acked version with the manifest's digest (when known)
    error: str
    transport: str                  # of the acked version's manifest, "" when unknown
    seconds_since_publish: float | None


class Subscription:
    """One live Subscribe stream. Holds only the newest manifest not yet taken (a slow reader skips versions)."""

    def __init__(self, sub_id: int, replica_id: str, cond: threading.Condition) -> None:
        self.sub_id = sub_id
        self.replica_id = replica_id
        self._cond = cond
        self._pending: weights_pb2.WeightManifest | None = None
        self.closed = False

    def offer(self, manifest: weights_pb2.WeightManifest) -> None:   # caller holds the board's lock
        self._pending = manifest

    def next(self, timeout: float) -> weights_pb2.WeightManifest | None:
        """The next manifest to send, or None after timeout or once closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending is not None or self.closed, timeout)
            m, self._pending = self._pending, None
            return None if self.closed else m


class VersionBoard:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._manifests: OrderedDict[int, Published] = OrderedDict()
        self._latest: weights_pb2.WeightManifest | None = None
        self._subs: dict[int, Subscription] = {}
        self._replicas: dict[str, Replica] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self._peers: dict[tuple[str, str], weight_sync_pb2.PeerInfo] = {}      # (transport, peer id) -> PeerInfo

    # --- trainer -------------------------------------------------------------------------------------------------
    def publish(self, manifest: weights_pb2.WeightManifest) -> int:
        """Make `manifest` the latest and offer it to every subscription; returns how many there are."""
        with self._cond:
            self._manifests.pop(manifest.version, None)
            self._manifests[manifest.version] = Published(manifest, time.monotonic())
            while len(self._manifests) > KEEP_MANIFESTS:
                self._manifests.popitem(last=False)
            self._latest = manifest
            for sub in self._subs.values():
                sub.offer(manifest)
            self._cond.notify_all()
            return len(self._subs)

    @property
    def latest(self) -> weights_pb2.WeightManifest | None:
        with self._cond:
            return self._latest

    # --- replicas ------------------------------------------------------------------------------------------------
    def subscribe(self, replica_id: str, have_version: int, have_epoch: int = 0) -> Subscription:
        with self._cond:
            sub = Subscription(next(self._ids), replica_id, self._cond)
            sub.closed = self._closed
            if self._latest is not None and order(self._latest) > (have_epoch, have_version):
                sub.offer(self._latest)
            self._subs[sub.sub_id] = sub
            self._cond.notify_all()
            return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._cond:
            sub.closed = True
            self._subs.pop(sub.sub_id, None)
            self._cond.notify_all()

    def ack(self, result: weights_pb2.UpdateResult) -> AckOutcome:
        """Record what a replica serves now; a failure or a digest other than the manifest's counts a failure."""
        with self._cond:
            rep = self._replicas.setdefault(result.replica_id, Replica(result.replica_id))
            pub = self._manifests.get(result.version)
            error = result.error
            ok = result.ok
            if ok and pub is not None and result.digest != pub.manifest.digest:
                ok = False
                error = (f"digest mismatch for version {result.version}: replica holds {result.digest or '(none)'}, "
                         f"manifest has {pub.manifest.digest}")
            if not ok and not error:
                error = "update failed (no reason given)"
            rep.version, rep.digest, rep.ok, rep.error = result.version, result.digest, ok, error
            rep.last_update, rep.acked = time.time(), True
            rep.failures += 0 if ok else 1
            self._cond.notify_all()
            return AckOutcome(ok, error, pub.manifest.transport if pub else "",
                              time.monotonic() - pub.at if pub else None)

    # --- data-plane peers (NIXL agents, the trainer's collective rendezvous) ----------------------------------------
    def register(self, peer: weight_sync_pb2.PeerInfo, transport: str, peer_id: str) -> None:
        """Remember (or replace) how to reach `peer_id`'s data plane for `transport`."""
        with self._cond:
            self._peers[(transport, peer_id)] = peer
            self._cond.notify_all()

    def peers(self, transport: str, min_peers: int, wait_seconds: float) -> list[weight_sync_pb2.PeerInfo]:
        """Registered peers of `transport` (by id), waiting up to wait_seconds until there are min_peers."""
        deadline = time.monotonic() + max(0.0, wait_seconds)
        with self._cond:
            while True:
                found = [p for (t, _), p in sorted(self._peers.items(), key=lambda kv: kv[0]) if t == transport]
                left = deadline - time.monotonic()
                if len(found) >= min_peers or left <= 0 or self._closed:
                    return found
                self._cond.wait(min(left, 1.0))

    # --- anyone ---------------------------------------------------------------------------------------------------
    def _subscribed(self) -> list[str]:
        return sorted({s.replica_id for s in self._subs.values()})

    def _state(self, version: int) -> tuple[int, bool, list[Replica]]:
        if version == 0 and self._latest is not None:
            version = self._latest.version
        pub = self._manifests.get(version)
        replicas = [self._replicas.get(r) or Replica(r) for r in self._subscribed()]
        current = pub is not None and all(
            r.acked and r.ok and r.version == version and r.digest == pub.manifest.digest for r in replicas)
        return version, current, replicas

    def verify(self, version: int, wait_seconds: float) -> tuple[int, bool, list[Replica]]:
        """(version, all_current, subscribed replicas), waiting up to wait_seconds for all_current.

        version 0 means the latest published. all_current: the version was published (and is among the last
        KEEP_MANIFESTS) and every subscribed replica's last ack is ok, of this version, with the manifest's digest.
        With no replica subscribed it is true (as the proto says); callers that need replicas check `replicas`.
        """
        deadline = time.monotonic() + max(0.0, wait_seconds)
        with self._cond:
            while True:
                state = self._state(version)
                left = deadline - time.monotonic()
                if state[1] or left <= 0 or self._closed:
                    return state[0], state[1], [Replica(**vars(r)) for r in state[2]]
                self._cond.wait(min(left, 1.0))

    def close(self) -> None:
        """Wake and end every subscription and waiter (service shutdown)."""
        with self._cond:
            self._closed = True
            for sub in self._subs.values():
                sub.closed = True
            self._cond.notify_all()
