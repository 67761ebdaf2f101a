"""The bucketed transport: per-dtype fixed-size buckets streamed over gRPC (WeightStream.Fetch).

Trainer (send side): `BucketedSender(bind, token, bucket_bytes).stage(version, step, named_tensors) -> manifest`.
Replica (receive side): `fetch(manifest, token, timeout, replica_id) -> [(name, tensor)]` or WeightTransferError.
"""

from __future__ import annotations

from services.weight_sync.transports.bucketed_receiver import fetch
from services.weight_sync.transports.bucketed_sender import BucketedSender
from services.weight_sync.transports.errors import WeightTransferError

__all__ = ["BucketedSender", "WeightTransferError", "fetch"]
