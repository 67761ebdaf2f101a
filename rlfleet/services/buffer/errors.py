"""Why a buffer call is refused; the gRPC servicer maps each to a status code."""

from __future__ import annotations


class BufferRefusal(Exception):
    """Base class: the call was refused and nothing changed."""


class InvalidSample(BufferRefusal):
    """A malformed sample (INVALID_ARGUMENT)."""


class UnknownGroup(BufferRefusal):
    """A sample for a group the buffer never issued (FAILED_PRECONDITION)."""


class BufferFull(BufferRefusal):
    """Capacity stayed full for the whole wait (RESOURCE_EXHAUSTED)."""


class StepCommitted(BufferRefusal):
    """GetBatch for a step that is already acknowledged (FAILED_PRECONDITION)."""


class CheckpointBehind(BufferRefusal):
    """A trainer resuming from a checkpoint older than the buffer's committed step (FAILED_PRECONDITION)."""


class InvalidRequest(BufferRefusal):
    """A request naming a step or version out of bounds: past the delivered steps, ahead of published versions
    (INVALID_ARGUMENT)."""
