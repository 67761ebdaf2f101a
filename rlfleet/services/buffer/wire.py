"""Replies encoded straight from stored bytes: a Batch's samples are already serialized Samples, so they are framed
as field 2 of the Batch message (tag + length + bytes) instead of being parsed and serialized again."""

from __future__ import annotations

from collections.abc import Sequence

from rlfleet.sample.put_wire import varint
from rlfleet.v1 import buffer_pb2

_SAMPLES_TAG = b"\x12"        # Batch.samples: field 2, wire type 2 (length-delimited)


def encode_batch(step: int, samples: Sequence[bytes], group_ids: Sequence[str], complete: bool,
                 redelivered: bool, acked_samples: int = 0) -> bytes:
    """The wire form of rlfleet.v1.Batch; a parser reads it exactly as Batch(samples=[parsed samples], ...)."""
    head = buffer_pb2.Batch(step=step, group_ids=group_ids, complete=complete, redelivered=redelivered,
                            acked_samples=acked_samples)
    parts = [head.SerializeToString()]
    for data in samples:
        parts += (_SAMPLES_TAG, varint(len(data)), data)
    return b"".join(parts)
