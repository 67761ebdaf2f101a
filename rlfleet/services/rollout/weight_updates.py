"""Apply a published weight version to the engine: fetch, verify, load, recompute the digest, acknowledge.

The same path serves the WeightSync subscription and the Rollout.LoadWeights RPC. The fetch (network, collective,
NIXL or delta files) runs while the engine keeps generating; only the load pauses it, in one of two modes:
`in_place` (in-flight requests continue under the new weights) or `retract` (in-flight requests are aborted, so the
work loop re-queues them). A failed attempt is retried (with waits of 1 to 16 s while the data plane cannot be
reached; once for any other failure, never for a signature that does not verify); then the failure is reported
(ok=false) and the previous version keeps serving.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc
import torch

from rlfleet.security.identity import Credential
from rlfleet.security.signing import SignatureError, Verifier, verify_manifest, verify_weights
from rlfleet.services.rollout.engines.base import Pausable, WeightLoadTarget, on_engine_thread
from rlfleet.services.rollout.engines.lora import LoraMerger
from rlfleet.services.weight_sync.transports.contract import Fetch, Receiver, ReceiverSetup, WeightHolder
from rlfleet.services.weight_sync.transports.errors import WeightTransferError
from rlfleet.services.weight_sync.transports.manifest import digest_of
from rlfleet.services.weight_sync.transports.registry import transport
from rlfleet.v1 import weight_sync_pb2, weight_sync_pb2_grpc, weights_pb2
from rlfleet.weights.tied import TIED_OPTION, with_aliases

log = logging.getLogger(__name__)
# Waits between attempts when the data plane could not be reached (a transfer error): a trainer pod just started or
# restarted may not resolve or answer for some seconds, and a version no attempt fetched is never offered again
# (the next comes with the next step, which waits for this replica's samples). Any other failure is retried once.
TRANSFER_RETRY_WAITS = (1.0, 2.0, 4.0, 8.0, 16.0)
TRANSIENT = (WeightTransferError, ConnectionError, grpc.RpcError)

Receivers = Callable[[str], Fetch]


def default_receivers(transport: str) -> Fetch:
    from rlfleet.services.weight_sync.transports import get_receiver

    return get_receiver(transport)


class WeightMismatchError(RuntimeError):
    """Received tensors or the engine's holdings do not match the manifest."""


def held_digest(engine: WeightHolder, names: list[str]) -> str:
    held = dict(engine.named_weights())
    missing = [n for n in names if n not in held]
    if missing:
        raise WeightMismatchError(f"engine holds no tensor named {missing[0]!r} ({len(missing)} missing)")
    return digest_of((n, held[n]) for n in names)


PAUSE_MODES = ("in_place", "retract")
KEEP_EPOCHS = 64          # versions whose epoch a replica remembers (far more than any staleness bound)


class WeightUpdater:
    def __init__(self, engine: WeightLoadTarget, replica_id: str, token: Credential, timeout: float,
                 receivers: Receivers = default_receivers,
                 ack: Callable[[weights_pb2.UpdateResult], None] | None = None, pause_mode: str = "in_place",
                 verifier: Verifier | None = None) -> None:
        if pause_mode not in PAUSE_MODES:
            raise ValueError(f"pause_mode must be one of {PAUSE_MODES}, got {pause_mode!r}")
        self.pause_mode = pause_mode
        self.engine = engine
        self.replica_id = replica_id
        self._token = token
        self._timeout = timeout
        self._receivers = receivers
        self._ack = ack
        self._verifier = verifier            # set: only versions signed by the trainer's key are loaded
        self._lock = threading.Lock()          # one update at a time (subscription and LoadWeights)
        self.digest = ""                       # digest of the last applied version ("" = initial weights)
        self.epoch = 0                         # trainer epoch of the last applied version (0 = initial weights)
        self._epochs: dict[int, int] = {}      # recently applied version -> the epoch it was applied under
        self.failures = 0
        self.listeners: list[Callable[[], None]] = []   # told after each applied version (the work loop's Claim)
        self._lora: LoraMerger | None = None              # made by the first adapter-only version

    def epoch_of(self, version: int) -> int:
        """The trainer epoch under which `version` was last applied (0: the initial weights, or a version applied
        longer ago than the staleness any buffer keeps). Samples carry it (Sample.weight_epoch): the same version
        number under two epochs names two different sets of weights (rlfleet/run_dir/lineage.py)."""
        return self._epochs.get(version, 0)

    def _applied(self, version: int, epoch: int) -> None:
        self.epoch = epoch
        self._epochs[version] = epoch
        while len(self._epochs) > KEEP_EPOCHS:
            del self._epochs[min(self._epochs)]
        for listener in self.listeners:
            listener()

    def newer(self, manifest: weights_pb2.WeightManifest) -> bool:
        """Whether manifest is newer than what the engine serves, by (epoch, version): after a trainer resumed from
        an older checkpoint (a newer epoch), its lower-numbered versions replace the abandoned lineage's."""
        return (manifest.epoch, manifest.version) > (self.epoch, self.engine.weight_version)

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
        if self._verifier is not None:       # before any state change or allocation: the epoch is signed too
            try:
                verify_manifest(manifest, self._verifier)
            except SignatureError as exc:
                log.warning("weight version %d refused: %s", manifest.version, exc)
                self.failures += 1
                return weights_pb2.UpdateResult(replica_id=self.replica_id, version=self.engine.weight_version,
                                                ok=False, error=f"SignatureError: {exc}", digest=self.digest,
                                                seconds=time.monotonic() - start)
        if manifest.version == self.engine.weight_version and manifest.digest == self.digest:
            self._applied(manifest.version, max(self.epoch, manifest.epoch))   # the same weights, any epoch
            return weights_pb2.UpdateResult(replica_id=self.replica_id, version=manifest.version, ok=True,
                                            digest=self.digest)               # already applied (LoadWeights + sub)
        first = error = ""
        attempt = 0
        while True:
            attempt += 1
            try:
                nbytes = self._fetch_and_load(manifest)
                self._applied(manifest.version, manifest.epoch)
                return weights_pb2.UpdateResult(replica_id=self.replica_id, version=manifest.version, ok=True,
                                                digest=self.digest, seconds=time.monotonic() - start, bytes=nbytes)
            except Exception as exc:  # noqa: BLE001 - any failure keeps the previous version serving
                error = f"{type(exc).__name__}: {exc}"
                first = first or error
                log.warning("weight version %d, attempt %d failed: %s", manifest.version, attempt, error)
                if isinstance(exc, SignatureError):      # forged or unsigned: fetching again cannot help
                    break
                waits = TRANSFER_RETRY_WAITS if isinstance(exc, TRANSIENT) else (0.0,)
                if attempt > len(waits):
                    break
                time.sleep(waits[attempt - 1])
        self.failures += 1
        if error != first:          # the first failure is the cause; a retry often fails only as its consequence
            error = f"{first} (then {attempt - 1} more attempt(s) failed, the last: {error})"
        return weights_pb2.UpdateResult(replica_id=self.replica_id, version=self.engine.weight_version, ok=False,
                                        error=error, digest=self.digest, seconds=time.monotonic() - start)

    def _fetch_and_load(self, manifest: weights_pb2.WeightManifest) -> int:
        names = [e.name for e in manifest.tensors]
        if manifest.data_plane_token and self._verifier is None:
            raise SignatureError(f"weight version {manifest.version} comes over a plaintext data plane "
                                 "(weight_sync.data_plane_tls false) and this replica holds no signing public key "
                                 "to check it with")
        tensors = self._receivers(manifest.transport)(manifest, self._token, self._timeout, self.replica_id)
        got = [n for n, _ in tensors]
        if got != names:                                                   # verify before touching the engine
            raise WeightMismatchError(f"received {len(got)} tensors, manifest lists {len(names)} (or another order)")
        if digest_of(tensors) != manifest.digest:
            raise WeightMismatchError("received tensors do not hash to the manifest digest")
        if self._verifier is not None:           # every transport: signature, then BLAKE3 of every tensor
            verify_weights(manifest, tensors, self._verifier)
        if manifest.adapter_only:  # LoRA: merge W_base + alpha/r * B @ A (rlfleet/services/rollout/engines/lora.py)
            merger = self._lora = self._lora or LoraMerger(self.engine)
            merged = on_engine_thread(self.engine, lambda: merger.merged(tensors, manifest.options))
            self._load(merged, manifest.version)
            self.digest = merger.record(tensors)
            return sum(int(t.numel() * t.element_size()) for _, t in tensors)
        self._load(with_aliases(tensors, manifest.options.get(TIED_OPTION, ""), self.engine.tied_aliases()),
                   manifest.version)
        digest = held_digest(self.engine, names)
        if digest != manifest.digest:
            raise WeightMismatchError(f"engine digest {digest} != manifest digest {manifest.digest} after loading")
        self.digest = digest
        log.info("serving weight version %d (digest %s)", manifest.version, digest)
        return sum(int(t.numel() * t.element_size()) for _, t in tensors)


    def _load(self, tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Pause (briefly), load, resume. retract: abort in-flight requests first (the work loop re-queues them)."""
        engine = self.engine
        if not isinstance(engine, Pausable):
            engine.update_weights_from_tensor(tensors, version)
            return
        was_paused = engine.paused
        in_flight = engine.pause()
        try:
            if self.pause_mode == "retract" and in_flight:
                aborted = engine.abort_in_flight()
                log.info("retracted %d in-flight requests for weight version %d", aborted, version)
            engine.update_weights_from_tensor(tensors, version)
        finally:
            if not was_paused:
                engine.resume()


class TransportReceivers:
    """`Receivers` for a replica: each transport's receiver is built once, at start-up, from the registry, and
    reused. broadcast joins the trainer's group in the background, nixl registers staging memory for
    `capacity_bytes`, disk_delta rebuilds versions from what the engine holds; those that need the control plane
    are left out without one. A transport not set up here falls back to its stateless fetch (`default_receivers`).
    """

    def __init__(self, engine: WeightHolder, replica_id: str, control: grpc.Channel | None,
                 transports: tuple[str, ...], capacity_bytes: int = 0, device: str = "cpu",
                 join_seconds: float = 120.0) -> None:
        setup = ReceiverSetup(replica_id=replica_id, holder=engine, control=control, capacity_bytes=capacity_bytes,
                              device=device, join_seconds=join_seconds)
        self.receivers: dict[str, Receiver] = {}
        for name in transports:
            plug = transport(name)
            if plug.needs_control and control is None:
                continue
            self.receivers[name] = plug.make_receiver(setup)

    def __call__(self, name: str) -> Fetch:
        receiver = self.receivers.get(name)
        return receiver.fetch if receiver is not None else default_receivers(name)

    def close(self) -> None:
        for receiver in self.receivers.values():
            receiver.close()


def staging_capacity(engine: WeightHolder, bucket_bytes: int) -> int:
    """Bytes of one NIXL staging slot for this engine's weights laid out in buckets (padding included)."""
    from rlfleet.services.weight_sync.transports.layout import TensorSpec, plan
    from rlfleet.weights.dtypes import dtype_name

    specs = [TensorSpec(n, dtype_name(t.dtype), tuple(t.shape), t.numel() * t.element_size())
             for n, t in engine.named_weights()]
    return plan(specs, bucket_bytes).total_bytes


def subscribe_loop(channel: grpc.Channel, updater: WeightUpdater, stop: threading.Event,
                   stream_seconds: float = 300.0) -> None:
    """Follow WeightSync.Subscribe; apply each manifest newer than what the engine serves. Reconnects forever."""
    stub = weight_sync_pb2_grpc.WeightSyncStub(channel)
    backoff = 0.5
    current: list[grpc.Future | None] = [None]        # the live Subscribe call (a Future and an iterator)

    def cancel_on_stop() -> None:
        stop.wait()
        if current[0] is not None:
            current[0].cancel()

    threading.Thread(target=cancel_on_stop, name="subscribe-stop", daemon=True).start()
    while not stop.is_set():
        try:
            request = weight_sync_pb2.SubscribeRequest(replica_id=updater.replica_id,
                                                       have_version=updater.engine.weight_version,
                                                       have_epoch=updater.epoch)
            current[0] = call = stub.Subscribe(request, timeout=stream_seconds)
            for manifest in call:
                backoff = 0.5
                if updater.newer(manifest):
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
