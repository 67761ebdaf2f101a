"""Bucket layout: per-dtype streams, fixed-size buckets, straddling tensors, and what a manifest may claim."""

from __future__ import annotations

import pytest
import torch

from rlfleet.services.weight_sync.transports.layout import ALIGN, LayoutError, TensorSpec, layout_of, plan
from rlfleet.services.weight_sync.transports.manifest import digest_of, manifest_digest, tensor_xxh64
from rlfleet.v1 import weights_pb2


def spec(name: str, dtype: str, n: int, size: int) -> TensorSpec:
    return TensorSpec(name, dtype, (n,), n * size)


def manifest_for(specs: list[TensorSpec], bucket_bytes: int) -> weights_pb2.WeightManifest:
    layout = plan(specs, bucket_bytes)
    return weights_pb2.WeightManifest(
        bucket_bytes=layout.bucket_bytes, num_buckets=layout.num_buckets,
        tensors=[weights_pb2.TensorEntry(name=s.name, dtype=s.dtype, shape=list(s.shape), bucket=p.bucket,
                                         offset=p.offset, nbytes=p.nbytes)
                 for s, p in zip(specs, layout.placements, strict=True)])


def test_dtypes_get_their_own_buckets_and_tensors_straddle() -> None:
    specs = [spec("a", "float32", 10, 4), spec("b", "bfloat16", 5, 2), spec("c", "float32", 30, 4)]
    layout = plan(specs, 64)
    # float32 stream: a [0, 40), c [40, 160) -> buckets 0, 1 (full), 2 (32 B); bfloat16 stream: b -> bucket 3
    assert [(p.bucket, p.offset) for p in layout.placements] == [(0, 0), (3, 0), (0, 40)]
    assert layout.bucket_sizes == (64, 64, 32, 16)                     # last bucket of a dtype padded to ALIGN
    assert layout.bucket_starts == (0, 64, 128, 160)
    assert layout.flat_start(layout.placements[2]) == 40             # c contiguous across buckets 0..2


def test_bucket_bytes_rounded_down_to_alignment() -> None:
    assert plan([spec("a", "float32", 100, 4)], 100).bucket_bytes == 96
    assert plan([spec("a", "float32", 1, 4)], 3).bucket_bytes == ALIGN


def test_empty_tensors_take_no_bucket() -> None:
    layout = plan([TensorSpec("e", "float32", (0, 3), 0)], 64)
    assert layout.num_buckets == 0 and layout.placements[0].nbytes == 0


def test_manifest_layout_matches_plan() -> None:
    specs = [spec("a", "float32", 10, 4), spec("b", "bfloat16", 5, 2), spec("c", "float32", 30, 4),
             TensorSpec("s", "int64", (), 8)]
    assert layout_of(manifest_for(specs, 64)) == plan(specs, 64)


@pytest.mark.parametrize(("edit", "match"), [
    (lambda m: setattr(m.tensors[0], "nbytes", 44), "nbytes 44"),
    (lambda m: setattr(m.tensors[0], "dtype", "complex64"), "unsupported dtype"),
    (lambda m: setattr(m.tensors[2], "bucket", 9), "outside"),
    (lambda m: setattr(m, "num_buckets", m.num_buckets + 1), "holds no tensor"),
    (lambda m: setattr(m, "num_buckets", 2), "outside|run past"),
    (lambda m: setattr(m, "bucket_bytes", 60), "multiple of 16"),
])
def test_inconsistent_manifest_is_refused(edit, match: str) -> None:  # noqa: ANN001
    m = manifest_for([spec("a", "float32", 10, 4), spec("b", "bfloat16", 5, 2), spec("c", "float32", 30, 4)], 64)
    edit(m)
    with pytest.raises(LayoutError, match=match):
        layout_of(m)


def test_scalar_tensors_hash_like_their_one_element_form() -> None:
    assert tensor_xxh64(torch.tensor(1.5)) == tensor_xxh64(torch.tensor([1.5]))
    assert digest_of([("x", torch.tensor(2))]) == manifest_digest([("x", tensor_xxh64(torch.tensor([2])))])
