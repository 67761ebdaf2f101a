"""The rlfleet.v1.Buffer gRPC servicer: request/reply translation and status codes around BufferCore.

GetBatch answers with the Batch already encoded (rlfleet.services.buffer.wire): stored samples go out as the bytes
they came
in as, never parsed or serialized again; add_to_server registers the servicer with that serializer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from rlfleet.run_dir.lineage import Epoch
from rlfleet.security.identity import peer_of
from rlfleet.services.buffer.core import BufferCore
from rlfleet.services.buffer.errors import (
    BufferFull,
    BufferRefusal,
    CheckpointBehind,
    InvalidRequest,
    InvalidSample,
    StepCommitted,
    UnknownGroup,
)
from rlfleet.services.buffer.stores import StoreError
from rlfleet.services.buffer.wire import encode_batch
from rlfleet.v1 import buffer_pb2, buffer_pb2_grpc

log = logging.getLogger(__name__)
SERVICE = "rlfleet.v1.Buffer"
T = TypeVar("T")
_CODES: dict[type[Exception], grpc.StatusCode] = {
    InvalidSample: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownGroup: grpc.StatusCode.FAILED_PRECONDITION,
    BufferFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    StepCommitted: grpc.StatusCode.FAILED_PRECONDITION,
    CheckpointBehind: grpc.StatusCode.FAILED_PRECONDITION,
    StoreError: grpc.StatusCode.UNAVAILABLE,
}


def _wait(requested: float, context: grpc.ServicerContext) -> float:
    """The requested wait, cut short so the reply beats the caller's deadline."""
    left = context.time_remaining()
    return max(0.0, min(requested, left - 0.2)) if left is not None else max(0.0, requested)


class BufferService(buffer_pb2_grpc.BufferServicer):
    """Serves rlfleet.v1.Buffer over a BufferCore."""

    def __init__(self, core: BufferCore) -> None:
        self.core = core

    def _call(self, context: grpc.ServicerContext, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (BufferRefusal, StoreError) as exc:
            context.abort(next(c for t, c in _CODES.items() if isinstance(exc, t)), str(exc))
            raise  # unreachable: abort raises

    def Claim(self, request: buffer_pb2.ClaimRequest, context: grpc.ServicerContext) -> buffer_pb2.ClaimReply:
        context.add_callback(self.core.wake)         # a caller that goes away ends its wait (context.is_active)
        res = self._call(context, lambda: self.core.claim(request.replica_id, request.weight_version,
                                                          request.max_groups, _wait(request.wait_seconds, context),
                                                          restarted=request.restarted, alive=context.is_active))
        return buffer_pb2.ClaimReply(tickets=res.tickets, finished=res.finished, reason=res.reason,
                                     cancelled=res.cancelled)

    def Put(self, request: buffer_pb2.PutRequest, context: grpc.ServicerContext) -> buffer_pb2.PutReply:
        peer = peer_of(context)
        if peer is not None and peer.role == "rollout":     # mTLS: the certificate, not the message, says who put it
            for s in request.samples:
                s.replica_id = peer.name
        res = self._call(context, lambda: self.core.put(request.samples, _wait(request.wait_seconds, context)))
        return buffer_pb2.PutReply(accepted=res.accepted, duplicates=res.duplicates, cancelled=res.cancelled,
                                   outcomes=res.outcomes)

    def GetBatch(self, request: buffer_pb2.GetBatchRequest, context: grpc.ServicerContext) -> bytes:
        """The encoded rlfleet.v1.Batch (see add_to_server)."""
        lineage = [Epoch(e.epoch, e.base_version) for e in request.lineage]
        ack = request.ack_through_step if request.HasField("ack_through_step") else None
        res = self._call(context, lambda: self.core.get_batch(request.step, request.num_groups,
                                                              request.policy_version,
                                                              _wait(request.wait_seconds, context), lineage, ack))
        return encode_batch(res.step, res.samples, res.group_ids, res.complete, res.redelivered, res.acked)

    def Ack(self, request: buffer_pb2.AckRequest, context: grpc.ServicerContext) -> buffer_pb2.AckReply:
        return buffer_pb2.AckReply(acked_samples=self._call(context, lambda: self.core.ack(request.committed_step)))

    def Reject(self, request: buffer_pb2.RejectRequest, context: grpc.ServicerContext) -> buffer_pb2.RejectReply:
        res = self._call(context, lambda: self.core.reject(request.step, list(request.group_ids), request.reason))
        return buffer_pb2.RejectReply(quarantined_groups=res.quarantined_groups,
                                      quarantined_samples=res.quarantined_samples,
                                      requeued_groups=res.requeued_groups)

    def Stats(self, request: buffer_pb2.StatsRequest, context: grpc.ServicerContext) -> Any:
        return self._call(context, self.core.stats)

    def TrainerResume(self, request: buffer_pb2.TrainerResumeRequest,
                      context: grpc.ServicerContext) -> buffer_pb2.TrainerResumeReply:
        trained = {sample_id: t.step for t in request.trained for sample_id in t.sample_ids}
        res = self._call(context, lambda: self.core.trainer_resume(request.checkpoint_step, trained,
                                                                   request.allow_older_checkpoint))
        return buffer_pb2.TrainerResumeReply(committed_step=res.committed_step, dropped_samples=res.dropped_samples,
                                             acked_samples=res.acked_samples)


def _identity(data: bytes) -> bytes:
    return data


def add_to_server(servicer: BufferService, server: grpc.Server) -> None:
    """Register like buffer_pb2_grpc.add_BufferServicer_to_server, except that GetBatch replies are sent as encoded."""
    pb = buffer_pb2
    rpcs: dict[str, tuple[Callable[..., Any], Any, Any]] = {
        "Claim": (servicer.Claim, pb.ClaimRequest, pb.ClaimReply.SerializeToString),
        "Put": (servicer.Put, pb.PutRequest, pb.PutReply.SerializeToString),
        "GetBatch": (servicer.GetBatch, pb.GetBatchRequest, _identity),
        "Ack": (servicer.Ack, pb.AckRequest, pb.AckReply.SerializeToString),
        "Reject": (servicer.Reject, pb.RejectRequest, pb.RejectReply.SerializeToString),
        "Stats": (servicer.Stats, pb.StatsRequest, pb.BufferStats.SerializeToString),
        "TrainerResume": (servicer.TrainerResume, pb.TrainerResumeRequest, pb.TrainerResumeReply.SerializeToString),
    }
    handlers = {name: grpc.unary_unary_rpc_method_handler(fn, request_deserializer=req.FromString,
                                                          response_serializer=ser)
                for name, (fn, req, ser) in rpcs.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
