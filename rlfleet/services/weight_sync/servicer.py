"""rlfleet.v1.WeightSync over gRPC: the VersionBoard plus validation, metrics and the JSONL log."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import grpc

from rlfleet.runtime.metrics import JsonlLog, WeightSyncMetrics
from rlfleet.services.weight_sync.board import VersionBoard
from rlfleet.services.weight_sync.transports.manifest import check_manifest_digest
from rlfleet.v1 import weight_sync_pb2, weight_sync_pb2_grpc, weights_pb2

log = logging.getLogger(__name__)

MAX_VERIFY_WAIT = 3600.0      # seconds; the caller's own deadline usually ends a wait sooner
POLL_SECONDS = 1.0            # how often an idle Subscribe stream checks that its client is still there


class WeightSyncServicer(weight_sync_pb2_grpc.WeightSyncServicer):
    def __init__(self, board: VersionBoard, metrics: WeightSyncMetrics, jsonl: JsonlLog | None = None) -> None:
        self._board = board
        self._metrics = metrics
        self._jsonl = jsonl

    def Publish(self, request: weights_pb2.WeightManifest,  # noqa: N802 (gRPC method names)
                context: grpc.ServicerContext) -> weight_sync_pb2.PublishReply:
        problem = check_manifest_digest(request)
        if problem is None and not request.transport:
            problem = "manifest has no transport"
        if problem:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"version {request.version}: {problem}")
        latest = self._board.latest
        if latest is not None and request.epoch > latest.epoch:
            log.warning("version %d published under a new trainer epoch %d (was %d, version %d): replicas load it "
                        "even where its number is lower", request.version, request.epoch, latest.epoch,
                        latest.version)
        elif latest is not None and request.version < latest.version:
            log.warning("version %d published after version %d in the same epoch", request.version, latest.version)
        n = self._board.publish(request)
        self._metrics.published_version.set(request.version)
        log.info("published version %d (step %d, %s, %d tensors, %d bytes) to %d subscriber(s)", request.version,
                 request.step, request.transport, len(request.tensors), request.total_bytes, n)
        self._write({"event": "publish", "version": request.version, "step": request.step,
                     "transport": request.transport, "bytes": request.total_bytes, "subscribers": n})
        return weight_sync_pb2.PublishReply(subscribers=n)

    def Subscribe(self, request: weight_sync_pb2.SubscribeRequest,  # noqa: N802
                  context: grpc.ServicerContext) -> Iterator[weights_pb2.WeightManifest]:
        sub = self._board.subscribe(request.replica_id, request.have_version, request.have_epoch)
        context.add_callback(lambda: self._board.unsubscribe(sub))   # runs when the client goes away
        log.info("replica %s subscribed (has version %d)", request.replica_id, request.have_version)
        try:
            while context.is_active() and not sub.closed:
                manifest = sub.next(POLL_SECONDS)
                if manifest is not None:
                    yield manifest
        finally:
            self._board.unsubscribe(sub)
            log.info("replica %s unsubscribed", request.replica_id)

    def Ack(self, request: weights_pb2.UpdateResult,  # noqa: N802
            context: grpc.ServicerContext) -> weight_sync_pb2.UpdateAckReply:
        if not request.replica_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "UpdateResult.replica_id is empty")
        out = self._board.ack(request)
        m = self._metrics
        m.replica_version.labels(replica=request.replica_id).set(request.version)
        if out.ok:
            if out.transport and out.seconds_since_publish is not None:
                m.update_seconds.labels(transport=out.transport).observe(out.seconds_since_publish)
            if out.transport:
                m.bytes.labels(transport=out.transport).inc(request.bytes)
        else:
            m.failures.labels(replica=request.replica_id).inc()
            log.warning("replica %s failed to update: %s", request.replica_id, out.error)
        self._write({"event": "ack", "replica": request.replica_id, "version": request.version, "ok": out.ok,
                     "error": out.error, "seconds": request.seconds, "bytes": request.bytes,
                     "since_publish": out.seconds_since_publish})
        return weight_sync_pb2.UpdateAckReply()

    def Verify(self, request: weight_sync_pb2.VerifyRequest,  # noqa: N802
               context: grpc.ServicerContext) -> weight_sync_pb2.VerifyReply:
        wait = min(max(request.wait_seconds, 0.0), MAX_VERIFY_WAIT)
        left = context.time_remaining()
        if left is not None:
            wait = min(wait, max(0.0, left - 0.2))    # answer before the caller's deadline
        version, current, replicas = self._board.verify(request.version, wait)
        return weight_sync_pb2.VerifyReply(version=version, all_current=current, replicas=[
            weight_sync_pb2.ReplicaState(replica_id=r.replica_id, version=r.version, digest=r.digest, ok=r.ok,
                                         error=r.error, last_update_seconds=r.last_update, failures=r.failures)
            for r in replicas])

    def Register(self, request: weight_sync_pb2.PeerInfo,  # noqa: N802
                 context: grpc.ServicerContext) -> weight_sync_pb2.RegisterReply:
        if not request.peer_id or not request.transport:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "PeerInfo needs peer_id and transport")
        peer = weight_sync_pb2.PeerInfo()
        peer.CopyFrom(request)
        self._board.register(peer, request.transport, request.peer_id)
        log.info("data-plane peer %s registered for %s", request.peer_id, request.transport)
        self._write({"event": "register", "peer": request.peer_id, "transport": request.transport})
        return weight_sync_pb2.RegisterReply()

    def Peers(self, request: weight_sync_pb2.PeersRequest,  # noqa: N802
              context: grpc.ServicerContext) -> weight_sync_pb2.PeersReply:
        wait = min(max(request.wait_seconds, 0.0), MAX_VERIFY_WAIT)
        left = context.time_remaining()
        if left is not None:
            wait = min(wait, max(0.0, left - 0.2))
        found = self._board.peers(request.transport, request.min_peers, wait)
        return weight_sync_pb2.PeersReply(peers=found)

    def _write(self, record: dict) -> None:
        if self._jsonl is not None:
            self._jsonl.write({"service": "weight_sync", **record})
