"""Apply a published weight version to the engine: fetch, verify, load, recompute the digest, acknowledge.

The same path serves the WeightSync subscription and the Rollout.LoadWeights RPC. A failed attempt is retried once;
then the failure is reported (ok=false) and the previous version keeps serving.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import torch

from rlfleet.v1 import weight_sync_pb2, weight_sync_pb2_grpc, weights_pb2
from services.rollout.engines.base import Engine
from services.weight_sync.manifest import digest_of

log = logging.getLogger(__name__)

# (manifest, token, timeout, replica_id) -> [(name, tensor)]; raises WeightTransferError
Fetch = Callable[[weights_pb2.WeightManifest, str | None, float, str], list[tuple[str, torch.Tensor]]]
Receivers = Callable[[str], Fetch]


def default_receivers(transport: str) -> Fetch:
    from services.weight_sync.transports import get_receiver

    return get_receiver(transport)


class WeightMismatchError(RuntimeError):
    """Received tensors or the engine's holdings do not match the manifest."""


def held_digest(engine: Engine, names: list[str]) -> str:
    held = dict(engine.named_weights())
    missing = [n for n in names if n not in held]
    if missing:
        raise WeightMismatchError(f"engine holds no tensor named {missing[0]!r} ({len(missing)} missing)")
    return digest_of((n, held[n]) for n in names)


class WeightUpdater:
    def __init__(self, engine: Engine, replica_id: str, token: str | None, timeout: float,
                 receivers: Receivers = default_receivers, ack: Callable[[weights_pb2.UpdateResult], None] | None = None
                 ) -> None:
        self.engine = engine
        self.replica_id = replica_id
        self._token = token
        self._timeout = timeout
        self._receivers = receivers
        self._ack = ack
        self._lock = threading.Lock()          # one update at a time (subscription and LoadWeights)
        self.digest = ""                       # digest of the last applied version ("" = initial weights)
        self.failures = 0

    def apply(self, manifest: weights_pb2.WeightManifest) -> weights_pb2.UpdateResult:
        with self._lock:
            result = self._apply_locked(manifest)
        if self._ack is not None:
            try:
                self._ack(result)
            except grpc.RpcError as exc:
                log.warning("WeightSync.Ack for version %d failed: %s", manifest.version, exc.code())
        return result

    def _apply_locked(self, manifest: weights_pb2.WeightManifest) -> weights_pb2.UpdateResult:
        start = time.monotonic()
        if manifest.version == self.engine.weight_version and manifest.digest == self.digest:
            return weights_pb2.UpdateResult(replica_id=self.replica_id, version=manifest.version, ok=True,
                                            digest=self.digest)               # already applied (LoadWeights + sub)
        error = ""
        for attempt in (1, 2):
            try:
                nbytes = self._fetch_and_load(manifest)
                return weights_pb2.UpdateResult(replica_id=self.replica_id, version=manifest.version, ok=True,
                                                digest=self.digest, seconds=time.monotonic() - start, bytes=nbytes)
            except Exception as exc:  # noqa: BLE001 - any failure keeps the previous version serving
                error = f"{type(exc).__name__}: {exc}"
                log.warning("weight version %d, attempt %d failed: %s", manifest.version, attempt, error)
        self.failures += 1
        return weights_pb2.UpdateResult(replica_id=self.replica_id, version=self.engine.weight_version, ok=False,
                                        error=error, digest=self.digest, seconds=time.monotonic() - start)

    def _fetch_and_load(self, manifest: weights_pb2.WeightManifest) -> int:
        names = [e.name for e in manifest.tensors]
        tensors = self._receivers(manifest.transport)(manifest, self._token, self._timeout, self.replica_id)
        got = [n for n, _ in tensors]
        if got != names:                                                   # verify before touching the engine
            raise WeightMismatchError(f"received {len(got)} tensors, manifest lists {len(names)} (or another order)")
        if digest_of(tensors) != manifest.digest:
            raise WeightMismatchError("received tensors do not hash to the manifest digest")
        self.engine.update_weights_from_tensor(tensors, manifest.version)
        digest = held_digest(self.engine, names)
        if digest != manifest.digest:
            raise WeightMismatchError(f"engine digest {digest} != manifest digest {manifest.digest} after loading")
        self.digest = digest
        log.info("serving weight version %d (digest %s)", manifest.version, digest)
        return sum(int(t.numel() * t.element_size()) for _, t in tensors)


def subscribe_loop(channel: grpc.Channel, updater: WeightUpdater, stop: threading.Event,
                   stream_seconds: float = 300.0) -> None:
    """Follow WeightSync.Subscribe; apply each manifest newer than what the engine serves. Reconnects forever."""
    stub = weight_sync_pb2_grpc.WeightSyncStub(channel)
    backoff = 0.5
    current: list[Any] = [None]

    def cancel_on_stop() -> None:
        stop.wait()
        if current[0] is not None:
            current[0].cancel()

    threading.Thread(target=cancel_on_stop, name="subscribe-stop", daemon=True).start()
    while not stop.is_set():
        try:
            request = weight_sync_pb2.SubscribeRequest(replica_id=updater.replica_id,
                                                       have_version=updater.engine.weight_version)
            current[0] = call = stub.Subscribe(request, timeout=stream_seconds)
            for manifest in call:
                backoff = 0.5
                if manifest.version > updater.engine.weight_version:
                    updater.apply(manifest)
        except grpc.RpcError as exc:
            if stop.is_set() or exc.code() == grpc.StatusCode.CANCELLED:
                continue
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                log.info("WeightSync.Subscribe: %s; reconnecting in %.1fs", exc.code(), backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
            continue
        stop.wait(backoff)                       # the server closed the stream: resubscribe
