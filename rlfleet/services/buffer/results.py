"""What the buffer core's calls return (BufferCore in core.py; service.py turns them into gRPC replies)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rlfleet.v1 import buffer_pb2, sample_pb2


@dataclass(frozen=True)
class ClaimResult:
    tickets: list[buffer_pb2.GroupTicket]
    finished: bool
    reason: str
    cancelled: list[str] = field(default_factory=list)    # groups of this replica the buffer no longer wants


@dataclass(frozen=True)
class PutResult:
    accepted: int
    duplicates: int
    cancelled: int = 0           # samples of cancelled groups: not stored, counted as dropped (aborted)
    outcomes: tuple[buffer_pb2.PutOutcome, ...] = ()   # each sample's, in the request's order


def outcomes(samples: Sequence[sample_pb2.Sample], accepted: set[int], cancelled: set[int]
              ) -> tuple[buffer_pb2.PutOutcome, ...]:
    """PutOutcome of each sample by id() of its message: stored now, of a cancelled group, or else a duplicate."""
    return tuple(buffer_pb2.PUT_ACCEPTED if id(m) in accepted else buffer_pb2.PUT_CANCELLED if id(m) in cancelled
                 else buffer_pb2.PUT_DUPLICATE for m in samples)


@dataclass(frozen=True)
class ResumeResult:
    committed_step: int          # the buffer's, before the call
    dropped_samples: int         # dropped as trained (a checkpoint committed them)
    acked_samples: int


@dataclass(frozen=True)
class RejectResult:
    quarantined_groups: int
    quarantined_samples: int
    requeued_groups: int


MAX_REASON = 1024       # bytes of a Reject reason kept per group


@dataclass(frozen=True)
class BatchResult:
    step: int
    samples: list[bytes]           # raw serialized Samples, grouped by group, ordered by index
    group_ids: list[str]
    complete: bool
    redelivered: bool
    acked: int = 0                 # samples the call's ack_through acknowledged
