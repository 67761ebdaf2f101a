"""The rlfleet.v1.Buffer gRPC servicer: request/reply translation and status codes around BufferCore."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from rlfleet.v1 import buffer_pb2, buffer_pb2_grpc, sample_pb2
from services.buffer.core import BufferCore
from services.buffer.errors import BufferFull, BufferRefusal, InvalidSample, StepCommitted, UnknownGroup
from services.buffer.stores import StoreError

log = logging.getLogger(__name__)
T = TypeVar("T")
_CODES: dict[type[Exception], grpc.StatusCode] = {
    InvalidSample: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownGroup: grpc.StatusCode.FAILED_PRECONDITION,
    BufferFull: grpc.StatusCode.RESOURCE_EXHAUSTED,
    StepCommitted: grpc.StatusCode.FAILED_PRECONDITION,
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
            context.abort(_CODES[type(exc)], str(exc))
            raise  # unreachable: abort raises

    def Claim(self, request: buffer_pb2.ClaimRequest, context: grpc.ServicerContext) -> buffer_pb2.ClaimReply:
        res = self._call(context, lambda: self.core.claim(request.replica_id, request.weight_version,
                                                          request.max_groups, _wait(request.wait_seconds, context)))
        return buffer_pb2.ClaimReply(tickets=res.tickets, finished=res.finished, reason=res.reason)

    def Put(self, request: buffer_pb2.PutRequest, context: grpc.ServicerContext) -> buffer_pb2.PutReply:
        accepted, dups = self._call(context, lambda: self.core.put(request.samples,
                                                                   _wait(request.wait_seconds, context)))
        return buffer_pb2.PutReply(accepted=accepted, duplicates=dups)

    def GetBatch(self, request: buffer_pb2.GetBatchRequest, context: grpc.ServicerContext) -> buffer_pb2.Batch:
        res = self._call(context, lambda: self.core.get_batch(request.step, request.num_groups,
                                                              request.policy_version,
                                                              _wait(request.wait_seconds, context)))
        return buffer_pb2.Batch(step=res.step, samples=[sample_pb2.Sample.FromString(d) for d in res.samples],
                                group_ids=res.group_ids, complete=res.complete, redelivered=res.redelivered)

    def Ack(self, request: buffer_pb2.AckRequest, context: grpc.ServicerContext) -> buffer_pb2.AckReply:
        return buffer_pb2.AckReply(acked_samples=self._call(context, lambda: self.core.ack(request.committed_step)))

    def Stats(self, request: buffer_pb2.StatsRequest, context: grpc.ServicerContext) -> Any:
        return self._call(context, self.core.stats)
