"""Receive side of the bucketed transport: stream every bucket, rebuild the tensors, check every hash, or raise."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import grpc
import numpy as np
import torch

from rlfleet.runtime.rpc import channel
from rlfleet.security.identity import Credential
from rlfleet.security.signing import HashedTensors, tensor_blake3
from rlfleet.services.weight_sync.transports.errors import WeightTransferError
from rlfleet.services.weight_sync.transports.layout import Layout, checked_layout
from rlfleet.services.weight_sync.transports.manifest import buffer_xxh64, manifest_digest
from rlfleet.v1 import weight_sync_pb2, weight_sync_pb2_grpc, weights_pb2
from rlfleet.weights.dtypes import DTYPES

TRANSPORT = "bucketed"
_EMPTY_XXH64 = buffer_xxh64(b"")


class ArrivalHasher:
    """BLAKE3 of every tensor of a signed manifest, each on a helper thread as soon as all its bytes have arrived
    (the buckets before it are complete), so hashing overlaps the rest of the stream instead of following it."""

    def __init__(self, manifest: weights_pb2.WeightManifest, layout: Layout, flat: torch.Tensor) -> None:
        self._flat = flat
        spans = [(layout.flat_start(p), p.nbytes, e.name)
                 for e, p in zip(manifest.tensors, layout.placements, strict=True)]
        self._queue = sorted(spans)                      # by where each tensor ends up complete
        self._next = 0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"blake3-recv-v{manifest.version}")
        self._futures: dict[str, Future[str]] = {}

    def arrived(self, upto: int) -> None:
        """Every byte of the flat buffer before `upto` is in: hash the tensors that lie there."""
        while self._next < len(self._queue):
            start, n, name = self._queue[self._next]
            if start + n > upto:
                return
            self._futures[name] = self._pool.submit(tensor_blake3, self._flat[start:start + n])
            self._next += 1

    def digests(self) -> dict[str, str]:
        """name -> BLAKE3 hex of every tensor (waits for the hashes still running)."""
        try:
            return {name: f.result() for name, f in self._futures.items()}
        finally:
            self.close()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def receive_buckets(version: int, layout: Layout, chunks: Iterable[weight_sync_pb2.WeightChunk],
                    flat: torch.Tensor | None = None, hasher: ArrivalHasher | None = None) -> torch.Tensor:
    """Write every bucket's chunks into one flat buffer [layout.total_bytes] uint8; raise unless all arrived whole.

    Chunks of a bucket must come in order without gaps; buckets may interleave. `hasher` is told how far the
    buffer is complete (every bucket before the first unfinished one) as buckets finish.
    """
    if flat is None:
        flat = torch.empty(layout.total_bytes, dtype=torch.uint8)   # [total_bytes]
    buf = flat.numpy()
    nb = layout.num_buckets
    got = [0] * nb
    done = [False] * nb
    first_open = 0                      # every bucket before it is complete
    for c in chunks:
        if c.version != version:
            raise WeightTransferError(version, f"sender streamed a chunk of version {c.version}")
        b = c.bucket
        if b >= nb:
            raise WeightTransferError(version, f"chunk of bucket {b}, but the manifest has {nb} buckets")
        if done[b]:
            raise WeightTransferError(version, f"chunk of bucket {b} after its last chunk")
        if c.offset != got[b]:
            raise WeightTransferError(version, f"bucket {b}: chunk at offset {c.offset}, expected {got[b]}")
        n = len(c.data)
        size = layout.bucket_sizes[b]
        if got[b] + n > size:
            raise WeightTransferError(version, f"bucket {b}: size mismatch, {got[b] + n} bytes for {size}-byte bucket")
        start = layout.bucket_starts[b] + got[b]
        buf[start:start + n] = np.frombuffer(c.data, dtype=np.uint8)
        got[b] += n
        if c.last:
            if got[b] != size:
                raise WeightTransferError(version, f"bucket {b}: size mismatch, ended after {got[b]} of {size} bytes")
            done[b] = True
            if hasher is not None and b == first_open:
                while first_open < nb and done[first_open]:
                    first_open += 1
                hasher.arrived(layout.bucket_starts[first_open - 1] + layout.bucket_sizes[first_open - 1])
    missing = [b for b in range(nb) if not done[b]]
    if missing:
        shown = ", ".join(str(b) for b in missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise WeightTransferError(version, f"stream truncated: {len(missing)} of {nb} buckets missing or incomplete "
                                           f"({shown}); {sum(got)} of {layout.total_bytes} bytes received")
    return flat


def unpack(manifest: weights_pb2.WeightManifest, layout: Layout, flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Tensors as views of `flat` (aligned ones) in manifest order, after every xxh64 and the digest match."""
    version = manifest.version
    buf = flat.numpy()
    out: list[tuple[str, torch.Tensor]] = []
    hashes: list[tuple[str, str]] = []
    bad: list[str] = []
    for e, p in zip(manifest.tensors, layout.placements, strict=True):
        dtype, shape = DTYPES[e.dtype], tuple(e.shape)
        if p.nbytes:
            s = layout.flat_start(p)
            h = buffer_xxh64(memoryview(buf[s:s + p.nbytes]))
            raw = flat[s:s + p.nbytes]                     # [nbytes] uint8
            if s % dtype.itemsize:
                raw = raw.clone()                          # only a hand-made manifest can misalign a tensor
            t = raw.view(dtype).reshape(shape)
        else:
            h, t = _EMPTY_XXH64, torch.empty(shape, dtype=dtype)
        if h != e.xxh64:
            bad.append(f"{e.name} (got {h}, manifest {e.xxh64})")
        hashes.append((e.name, h))
        out.append((e.name, t))
    if bad:
        raise WeightTransferError(version, f"checksum mismatch in {len(bad)} tensor(s): {'; '.join(bad[:4])}")
    if manifest_digest(hashes) != manifest.digest:
        raise WeightTransferError(version, f"digest mismatch: received {manifest_digest(hashes)}, "
                                           f"manifest {manifest.digest}")
    return out


def receive(manifest: weights_pb2.WeightManifest, layout: Layout,
            chunks: Iterable[weight_sync_pb2.WeightChunk]) -> list[tuple[str, torch.Tensor]]:
    """Consume a Fetch stream (gRPC call or any iterable of chunks) into checked tensors, or raise. A signed
    manifest's tensors come back as HashedTensors: their BLAKE3, computed while the stream still ran."""
    flat = torch.empty(layout.total_bytes, dtype=torch.uint8)   # [total_bytes]
    signed = bool(manifest.signature) and all(e.blake3 for e in manifest.tensors)
    hasher = ArrivalHasher(manifest, layout, flat) if signed else None
    try:
        receive_buckets(manifest.version, layout, chunks, flat, hasher)
        tensors = unpack(manifest, layout, flat)
    except grpc.RpcError as exc:
        if hasher is not None:
            hasher.close()
        code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
        details = exc.details() if hasattr(exc, "details") else str(exc)
        raise WeightTransferError(manifest.version,
                                  f"fetch from {manifest.endpoint} failed: {code}: {details}") from None
    except BaseException:
        if hasher is not None:
            hasher.close()
        raise
    return HashedTensors(tensors, hasher.digests()) if hasher is not None else tensors


def fetch(manifest: weights_pb2.WeightManifest, token: Credential, timeout: float,
          replica_id: str = "") -> list[tuple[str, torch.Tensor]]:
    """Fetch version `manifest.version` from `manifest.endpoint` and return (name, tensor) in manifest order.

    Every tensor is checked against its xxh64 and the manifest digest before anything is returned (a version that
    came over a plaintext data plane is only trusted after its signature is: the caller's job); any failure
    (RPC error, deadline, truncated stream, missing bucket, size or checksum mismatch) raises WeightTransferError.
    The returned tensors are CPU views into one buffer holding the whole version. Stateless: a connection (and
    under mTLS a handshake) per call; a replica keeps one open with StreamReceiver.
    """
    with channel(manifest.endpoint, _credential(manifest, token)) as ch:
        return _fetch_over(ch, manifest, timeout, replica_id)


def _credential(manifest: weights_pb2.WeightManifest, token: Credential) -> Credential:
    # a plaintext data plane (weight_sync.data_plane_tls false) asks for the manifest's token instead of our identity
    return manifest.data_plane_token or token


def _fetch_over(ch: grpc.Channel, manifest: weights_pb2.WeightManifest, timeout: float,
                replica_id: str) -> list[tuple[str, torch.Tensor]]:
    layout = checked_layout(manifest, TRANSPORT)
    stub = weight_sync_pb2_grpc.WeightStreamStub(ch)
    request = weight_sync_pb2.FetchRequest(version=manifest.version, replica_id=replica_id)
    return receive(manifest, layout, stub.Fetch(request, timeout=timeout))


class StreamReceiver:
    """The bucketed transport's Receiver on a replica: one channel to the trainer's data endpoint, kept open from
    version to version (a fresh connection each version cost a TCP connect and, under mTLS, a TLS handshake on the
    trainer's busy cores: ~3-5 ms of every update of a small model, bench in docs/architecture.md). A new endpoint
    or credential (a restarted trainer) opens a new channel; a failed fetch drops it, so the next one reconnects."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: tuple[str, str, int] | None = None
        self._channel: grpc.Channel | None = None

    def fetch(self, manifest: weights_pb2.WeightManifest, token: Credential, timeout: float,
              replica_id: str = "") -> list[tuple[str, torch.Tensor]]:
        credential = _credential(manifest, token)
        key = (manifest.endpoint, manifest.data_plane_token, id(token))
        with self._lock:
            if self._channel is None or key != self._key:
                self._close_locked()
                self._channel, self._key = channel(manifest.endpoint, credential), key
            try:
                return _fetch_over(self._channel, manifest, timeout, replica_id)
            except BaseException:
                self._close_locked()
                raise

    def _close_locked(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel, self._key = None, None

    def close(self) -> None:
        with self._lock:
            self._close_locked()
