"""The bucketed transport: per-dtype fixed-size buckets streamed over gRPC (WeightStream.Fetch).

Trainer (send side): `BucketedSender(bind, token, bucket_bytes).stage(version, step, named_tensors) -> manifest`.
Replica (receive side): `fetch(manifest, token, timeout, replica_id) -> [(name, tensor)]` or WeightTransferError.
"""

from __future__ import annotations

from rlfleet.services.weight_sync.transports.bucketed.receiver import StreamReceiver, fetch
from rlfleet.services.weight_sync.transports.bucketed.sender import BucketedSender
from rlfleet.services.weight_sync.transports.contract import ReceiverSetup, SenderSetup, Transport
from rlfleet.services.weight_sync.transports.errors import WeightTransferError


def make_sender(setup: SenderSetup) -> BucketedSender:
    return BucketedSender(bind=setup.endpoint, token=setup.token, bucket_bytes=setup.bucket_bytes,
                          chunk_bytes=setup.chunk_bytes)


def make_receiver(setup: ReceiverSetup) -> StreamReceiver:
    return StreamReceiver()


# not an auto candidate; always received: the broadcast transport's gRPC fallback arrives as bucketed
TRANSPORT = Transport("bucketed", make_sender, make_receiver, needs_endpoint=True, fetch=fetch, always_received=True)

__all__ = ["TRANSPORT", "BucketedSender", "StreamReceiver", "WeightTransferError", "fetch"]
