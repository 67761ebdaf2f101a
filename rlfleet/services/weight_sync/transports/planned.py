"""The manifest of a version whose layout was planned from specs and whose hashes were taken while filling."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rlfleet.services.weight_sync.transports.layout import Layout, TensorSpec
from rlfleet.services.weight_sync.transports.manifest import manifest_digest
from rlfleet.v1 import weights_pb2


def build_manifest(version: int, step: int, transport: str, endpoint: str, layout: Layout,
                   specs: Sequence[TensorSpec], hashes: Sequence[str],
                   options: Mapping[str, str] | None = None) -> weights_pb2.WeightManifest:
    entries = [weights_pb2.TensorEntry(name=s.name, dtype=s.dtype, shape=list(s.shape), bucket=p.bucket,
                                       offset=p.offset, nbytes=p.nbytes, xxh64=h)
               for s, p, h in zip(specs, layout.placements, hashes, strict=True)]
    return weights_pb2.WeightManifest(
        version=version, step=step, transport=transport, endpoint=endpoint, bucket_bytes=layout.bucket_bytes,
        tensors=entries, total_bytes=sum(s.nbytes for s in specs), num_buckets=layout.num_buckets,
        digest=manifest_digest((e.name, e.xxh64) for e in entries), options=dict(options or {}))
