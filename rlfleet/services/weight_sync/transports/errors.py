"""The one error every weight transport raises when an update cannot be applied whole."""

from __future__ import annotations


class WeightTransferError(RuntimeError):
    """A weight version could not be fetched complete and intact; nothing of it may be applied.

    Raised for RPC failures, truncated streams, missing buckets, size and checksum mismatches.
    """

    def __init__(self, version: int, message: str) -> None:
        super().__init__(f"weight version {version}: {message}")
        self.version = version


class GroupLost(RuntimeError):
    """The broadcast group broke during `stage` (a member died or left): the sender has already consumed every
    tensor it was given (so trainer ranks stay in lockstep) and dropped the group. The version was NOT staged:
    the caller stages it again -- every later `stage` serves all replicas over the gRPC stream instead."""

    def __init__(self, version: int, message: str) -> None:
        super().__init__(f"weight version {version}: broadcast group lost: {message}")
        self.version = version
