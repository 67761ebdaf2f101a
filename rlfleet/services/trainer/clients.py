"""The trainer's gRPC clients (Buffer, WeightSync, Rollout): deadlines on every call, bounded retries on
transient failures, and a PeerError that names the peer when it stays unreachable."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import grpc

from rlfleet.run_dir.lineage import Epoch
from rlfleet.runtime.rpc import DEFAULT_DEADLINE, channel
from rlfleet.security.identity import Credential
from rlfleet.v1 import (
    buffer_pb2,
    buffer_pb2_grpc,
    rollout_pb2,
    rollout_pb2_grpc,
    weight_sync_pb2,
    weight_sync_pb2_grpc,
    weights_pb2,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
PATIENCE = 60.0            # seconds a peer may stay unreachable before the trainer gives up
BATCH_POLL = 10.0          # seconds one GetBatch call waits on the buffer side


class PeerError(RuntimeError):
    """A peer service failed or stayed unreachable."""


def call(what: str, address: str, fn: Callable[..., T], request: Any, timeout: float,
         patience: float = PATIENCE) -> T:
    """fn(request, timeout=timeout), retried on UNAVAILABLE / DEADLINE_EXCEEDED for up to `patience` seconds."""
    give_up = time.monotonic() + patience
    delay = 0.2
    while True:
        try:
            return fn(request, timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            details = exc.details() if hasattr(exc, "details") else str(exc)
            if code in RETRYABLE and time.monotonic() + delay < give_up:
                log.warning("%s at %s: %s (%s); retrying", what, address, code.name, details)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            raise PeerError(f"{what} at {address} failed: {code.name}: {details}") from None


class BufferClient:
    def __init__(self, address: str, token: Credential, consumer: str = "trainer") -> None:
        self.address, self.consumer = address, consumer
        self.lineage: Sequence[Epoch] = ()          # named in every GetBatch (rlfleet/run_dir/lineage.py)
        self._channel = channel(address, token)
        self._stub = buffer_pb2_grpc.BufferStub(self._channel)
        self._get_batch = self._channel.unary_unary(            # the reply's bytes too: rank 0 broadcasts them as is
            "/rlfleet.v1.Buffer/GetBatch", request_serializer=buffer_pb2.GetBatchRequest.SerializeToString,
            response_deserializer=None)

    def get_batch(self, step: int, num_groups: int, policy_version: int,
                  ack_through: int | None = None) -> buffer_pb2.Batch:
        return self.get_batch_bytes(step, num_groups, policy_version, ack_through)[0]

    def get_batch_bytes(self, step: int, num_groups: int, policy_version: int,
                        ack_through: int | None = None) -> tuple[buffer_pb2.Batch, bytes]:
        """Block until the buffer delivers the complete batch for `step`: (the Batch, its wire bytes). ack_through:
        the last committed step, whose Ack rides on this GetBatch (GetBatchRequest.ack_through_step) instead of a
        separate Ack call; the first poll carries it (a retry carries it again: acks are cumulative)."""
        req = buffer_pb2.GetBatchRequest(step=step, num_groups=num_groups, policy_version=policy_version,
                                         wait_seconds=BATCH_POLL, consumer=self.consumer,
                                         lineage=[buffer_pb2.LineageEpoch(epoch=e.epoch, base_version=e.base_version)
                                                  for e in self.lineage])
        if ack_through is not None:
            req.ack_through_step = ack_through
        while True:
            data: bytes = call("Buffer.GetBatch", self.address, self._get_batch, req, BATCH_POLL + DEFAULT_DEADLINE)
            req.ClearField("ack_through_step")           # applied (durably) by the call that answered
            batch = buffer_pb2.Batch.FromString(data)
            if batch.complete:
                if len(batch.group_ids) != num_groups:
                    raise PeerError(f"Buffer.GetBatch at {self.address}: step {step} came with "
                                    f"{len(batch.group_ids)} groups, asked for {num_groups}")
                return batch, data

    def ack(self, committed_step: int) -> int:
        reply = call("Buffer.Ack", self.address, self._stub.Ack,
                     buffer_pb2.AckRequest(committed_step=committed_step, consumer=self.consumer), DEFAULT_DEADLINE)
        return reply.acked_samples

    def stats(self) -> buffer_pb2.BufferStats:
        return call("Buffer.Stats", self.address, self._stub.Stats, buffer_pb2.StatsRequest(), DEFAULT_DEADLINE)

    def trainer_resume(self, checkpoint_step: int, trained: Mapping[str, int],
                       allow_older: bool) -> buffer_pb2.TrainerResumeReply:
        """Buffer.TrainerResume: trained is sample id -> the step of the checkpoint that committed it. A refusal
        (a checkpoint older than the buffer's committed step) is a PeerError with the buffer's reason."""
        by_step: dict[int, list[str]] = {}
        for sample_id, step in trained.items():
            by_step.setdefault(step, []).append(sample_id)
        req = buffer_pb2.TrainerResumeRequest(
            checkpoint_step=checkpoint_step, allow_older_checkpoint=allow_older, consumer=self.consumer,
            trained=[buffer_pb2.TrainedSamples(step=s, sample_ids=ids) for s, ids in sorted(by_step.items())])
        return call("Buffer.TrainerResume", self.address, self._stub.TrainerResume, req, DEFAULT_DEADLINE)

    def reject(self, step: int, groups: dict[str, str]) -> buffer_pb2.RejectReply:
        """Quarantine these groups of the batch for `step` (group id -> why); the batch's others are ready again.
        Named groups make a retried call harmless."""
        reason = "; ".join(sorted(set(groups.values())))[:1000]
        req = buffer_pb2.RejectRequest(step=step, group_ids=list(groups), reason=reason, consumer=self.consumer)
        return call("Buffer.Reject", self.address, self._stub.Reject, req, DEFAULT_DEADLINE)

    def close(self) -> None:
        self._channel.close()


class WeightSyncClient:
    def __init__(self, address: str, token: Credential) -> None:
        self.address = address
        self._channel = channel(address, token)
        self._stub = weight_sync_pb2_grpc.WeightSyncStub(self._channel)

    def publish(self, manifest: weights_pb2.WeightManifest) -> int:
        return call("WeightSync.Publish", self.address, self._stub.Publish, manifest, DEFAULT_DEADLINE).subscribers

    def verify(self, version: int, wait_seconds: float) -> weight_sync_pb2.VerifyReply:
        req = weight_sync_pb2.VerifyRequest(version=version, wait_seconds=wait_seconds)
        return call("WeightSync.Verify", self.address, self._stub.Verify, req, wait_seconds + DEFAULT_DEADLINE)

    def close(self) -> None:
        self._channel.close()


class RolloutClient:
    def __init__(self, address: str, token: Credential) -> None:
        self.address = address
        self._channel = channel(address, token)
        self._stub = rollout_pb2_grpc.RolloutStub(self._channel)

    def generate(self, request: rollout_pb2.GenerateRequest, timeout: float,
                 patience: float = PATIENCE) -> rollout_pb2.GenerateReply:
        return call("Rollout.Generate", self.address, self._stub.Generate, request, timeout, patience)

    def close(self) -> None:
        self._channel.close()
