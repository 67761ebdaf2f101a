"""Where each tensor lives in the bucketed transport: per-dtype byte streams cut into fixed-size buckets.

Tensors of one dtype are concatenated (in the order given) into one byte stream; the stream is cut into buckets of
`bucket_bytes`; a tensor may start anywhere in a bucket and run on into the following buckets of its dtype. Every
bucket is full except the last of each dtype, which is padded with zeros to a multiple of ALIGN. So, laid end to end,
the buckets form one flat buffer in which each tensor is contiguous and aligned to its element size:
`flat[bucket_start[b] + offset : ... + nbytes]`. The sender plans a layout from tensors, the receiver re-derives the
same bucket sizes from a manifest, so nothing but the manifest has to travel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rlfleet.v1 import weights_pb2
from rlfleet.weights.dtypes import DTYPES

ALIGN = 16   # bytes; >= every element size we move, so bucket starts in the flat buffer keep tensors aligned


class LayoutError(ValueError):
    """A manifest whose tensor entries cannot describe a bucketed layout."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str              # torch dtype name, a key of manifest.DTYPES
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class Placement:
    bucket: int
    offset: int             # byte offset inside `bucket`; the tensor may run on into bucket + 1, ...
    nbytes: int


@dataclass(frozen=True)
class Layout:
    bucket_bytes: int
    bucket_sizes: tuple[int, ...]      # bytes of each bucket, padding included (each a multiple of ALIGN)
    bucket_starts: tuple[int, ...]     # byte offset of each bucket in the flat buffer
    placements: tuple[Placement, ...]  # one per tensor, in the order given

    @property
    def num_buckets(self) -> int:
        return len(self.bucket_sizes)

    @property
    def total_bytes(self) -> int:
        """Size of the flat buffer (all buckets end to end, padding included)."""
        return sum(self.bucket_sizes)

    def flat_start(self, p: Placement) -> int:
        return self.bucket_starts[p.bucket] + p.offset if p.nbytes else 0


def aligned_bucket_bytes(bucket_bytes: int) -> int:
    """bucket_bytes rounded down to a multiple of ALIGN (at least ALIGN)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    return max(ALIGN, bucket_bytes - bucket_bytes % ALIGN)


def _round_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _starts(sizes: Sequence[int]) -> tuple[int, ...]:
    out, pos = [], 0
    for s in sizes:
        out.append(pos)
        pos += s
    return tuple(out)


def plan(specs: Sequence[TensorSpec], bucket_bytes: int) -> Layout:
    """Assign every tensor a bucket and offset. Dtypes get buckets in order of first appearance."""
    bb = aligned_bucket_bytes(bucket_bytes)
    order: dict[str, list[int]] = {}
    for i, s in enumerate(specs):
        order.setdefault(s.dtype, []).append(i)
    placements: list[Placement | None] = [None] * len(specs)
    sizes: list[int] = []
    for indices in order.values():
        first, pos = len(sizes), 0
        for i in indices:
            n = specs[i].nbytes
            placements[i] = Placement(first + pos // bb, pos % bb, n) if n else Placement(0, 0, 0)
            pos += n
        full, rest = divmod(pos, bb)
        sizes += [bb] * full + ([_round_up(rest)] if rest else [])
    return Layout(bb, tuple(sizes), _starts(sizes), tuple(p for p in placements if p is not None))


def spec_of(entry: weights_pb2.TensorEntry) -> TensorSpec:
    """The spec a manifest entry describes; raises LayoutError when dtype, shape and nbytes disagree."""
    dtype = DTYPES.get(entry.dtype)
    if dtype is None:
        raise LayoutError(f"tensor {entry.name}: unsupported dtype '{entry.dtype}'")
    shape = tuple(int(d) for d in entry.shape)
    if any(d < 0 for d in shape):
        raise LayoutError(f"tensor {entry.name}: negative dimension in shape {list(shape)}")
    want = math.prod(shape) * dtype.itemsize
    if entry.nbytes != want:
        raise LayoutError(f"tensor {entry.name}: nbytes {entry.nbytes} but {entry.dtype}{list(shape)} is {want} bytes")
    return TensorSpec(entry.name, entry.dtype, shape, want)


def layout_of(manifest: weights_pb2.WeightManifest) -> Layout:
    """Re-derive the layout (bucket sizes included) from a manifest, checking every entry fits in its buckets."""
    bb = manifest.bucket_bytes
    if bb <= 0 or bb % ALIGN:
        raise LayoutError(f"manifest bucket_bytes {bb} is not a positive multiple of {ALIGN}")
    nb = manifest.num_buckets
    data = sum(int(e.nbytes) for e in manifest.tensors)
    if nb > len(manifest.tensors) + data // bb:      # plan() makes at most this many (a tail bucket per dtype)
        raise LayoutError(f"manifest declares {nb} buckets for {len(manifest.tensors)} tensors of {data} bytes")
    ends = [0] * nb
    placements = []
    for e in manifest.tensors:
        spec_of(e)
        p = Placement(e.bucket, e.offset, e.nbytes)
        placements.append(p)
        if not p.nbytes:
            continue
        if p.bucket >= nb or p.offset >= bb:
            raise LayoutError(f"tensor {e.name}: bucket {p.bucket} offset {p.offset} outside {nb} buckets of {bb} B")
        bucket, offset, left = p.bucket, p.offset, p.nbytes
        while left:
            if bucket >= nb:
                raise LayoutError(f"tensor {e.name}: {p.nbytes} bytes from bucket {p.bucket} run past bucket {nb - 1}")
            take = min(left, bb - offset)
            ends[bucket] = max(ends[bucket], offset + take)
            bucket, offset, left = bucket + 1, 0, left - take
    if any(end == 0 for end in ends):
        raise LayoutError(f"manifest declares {nb} buckets but bucket {ends.index(0)} holds no tensor")
    sizes = tuple(_round_up(end) for end in ends)
    if sum(sizes) > data + nb * ALIGN:               # routing fields are not signed: never allocate for padding
        raise LayoutError(f"manifest buckets take {sum(sizes)} bytes for {data} bytes of tensors")
    return Layout(bb, sizes, _starts(sizes), tuple(placements))


def checked_layout(manifest: weights_pb2.WeightManifest, transport: str) -> Layout:
    """The manifest's bucket layout, after checking its transport and digest: what every receiver does first."""
    from rlfleet.services.weight_sync.transports.errors import WeightTransferError
    from rlfleet.services.weight_sync.transports.manifest import check_manifest_digest

    version = manifest.version
    if manifest.transport != transport:
        raise WeightTransferError(version, f"manifest transport is '{manifest.transport}', not '{transport}'")
    problem = check_manifest_digest(manifest)
    if problem:
        raise WeightTransferError(version, problem)
    try:
        return layout_of(manifest)
    except LayoutError as exc:
        raise WeightTransferError(version, f"bad manifest: {exc}") from None
