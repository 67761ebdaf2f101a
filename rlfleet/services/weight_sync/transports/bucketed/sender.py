"""Send side of the bucketed transport: stage a version into buckets in memory, serve WeightStream.Fetch."""

from __future__ import annotations

import logging
import queue
import socket
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import grpc
import numpy as np
import torch

from rlfleet.runtime.rpc import MAX_MESSAGE_BYTES, Server
from rlfleet.security.identity import Credential
from rlfleet.services.weight_sync.transports.layout import ALIGN, Layout, TensorSpec, aligned_bucket_bytes, plan
from rlfleet.services.weight_sync.transports.manifest import buffer_xxh64, manifest_digest
from rlfleet.services.weight_sync.transports.sharded import materialize
from rlfleet.v1 import weight_sync_pb2, weight_sync_pb2_grpc, weights_pb2
from rlfleet.weights.dtypes import DTYPES, dtype_name

log = logging.getLogger(__name__)

TRANSPORT = "bucketed"
_CHUNK_LIMIT = MAX_MESSAGE_BYTES - (1 << 20)   # room for the WeightChunk fields around the data


@dataclass(frozen=True)
class StagedVersion:
    manifest: weights_pb2.WeightManifest
    layout: Layout
    flat: np.ndarray            # [layout.total_bytes] uint8: every bucket end to end


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor's raw bytes as a 1-D uint8 tensor on its own device. t: any shape -> [nbytes]."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def stage_tensors(version: int, step: int, named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int,
                  endpoint: str) -> StagedVersion:
    """Copy tensors into one flat host buffer laid out as buckets, hash each copy, build the manifest.

    Streams: when `named` knows its specs (a ShardedState) the layout is planned before any tensor arrives, and each
    tensor is copied, hashed and dropped as it comes, so at most one of them is alive at a time.
    """
    specs, tensors = materialize(named)
    for spec in specs:
        if spec.dtype not in DTYPES:
            raise ValueError(f"tensor {spec.name}: dtype {spec.dtype} is not supported by the bucketed transport")
    layout = plan(specs, bucket_bytes)
    flat_t = torch.empty(layout.total_bytes, dtype=torch.uint8)   # [total_bytes]
    flat = flat_t.numpy()
    for start, size in zip(layout.bucket_starts, layout.bucket_sizes, strict=True):
        flat[start + size - ALIGN:start + size] = 0   # a dtype's last bucket ends in < ALIGN bytes of zero padding
    entries = []
    arriving = iter(tensors)
    for spec, p in zip(specs, layout.placements, strict=True):
        name, t = next(arriving)
        _check_planned(name, t, spec)
        if p.nbytes:
            s = layout.flat_start(p)
            flat_t[s:s + p.nbytes].copy_(_as_bytes(t))
            digest = buffer_xxh64(memoryview(flat[s:s + p.nbytes]))
        else:
            digest = buffer_xxh64(b"")
        del t                                         # the gathered tensor goes as soon as it is copied
        entries.append(weights_pb2.TensorEntry(name=name, dtype=spec.dtype, shape=list(spec.shape), bucket=p.bucket,
                                               offset=p.offset, nbytes=p.nbytes, xxh64=digest))
    manifest = weights_pb2.WeightManifest(
        version=version, step=step, transport=TRANSPORT, endpoint=endpoint, bucket_bytes=layout.bucket_bytes,
        tensors=entries, total_bytes=sum(s.nbytes for s in specs), num_buckets=layout.num_buckets,
        digest=manifest_digest((e.name, e.xxh64) for e in entries))
    return StagedVersion(manifest, layout, flat)


def _check_planned(name: str, t: torch.Tensor, spec: TensorSpec) -> None:
    """A tensor that arrives must be the one its spec planned (a ShardedState's specs are read before the data)."""
    if name != spec.name or tuple(t.shape) != spec.shape or dtype_name(t.dtype) != spec.dtype:
        raise ValueError(f"tensor {name} {dtype_name(t.dtype)}{list(t.shape)} does not match the planned "
                         f"{spec.name} {spec.dtype}{list(spec.shape)}")


def _bucket_chunks(staged: StagedVersion, bucket: int, chunk_bytes: int) -> list[weight_sync_pb2.WeightChunk]:
    start, size = staged.layout.bucket_starts[bucket], staged.layout.bucket_sizes[bucket]
    version = staged.manifest.version
    return [weight_sync_pb2.WeightChunk(version=version, bucket=bucket, offset=off,
                                        data=staged.flat[start + off:start + min(off + chunk_bytes, size)].tobytes(),
                                        last=off + chunk_bytes >= size)
            for off in range(0, size, chunk_bytes)]


def _check_open(closed: threading.Event) -> None:
    if closed.is_set():
        raise ConnectionAbortedError("sender closed while streaming")


def stream_buckets(staged: StagedVersion, chunk_bytes: int,
                   closed: threading.Event) -> Iterator[weight_sync_pb2.WeightChunk]:
    """Yield every bucket's chunks in order while a background thread prepares the next bucket (two in memory)."""
    slots = threading.Semaphore(2)                 # bucket being sent + bucket being prepared
    ready: queue.Queue[list[weight_sync_pb2.WeightChunk] | BaseException | None] = queue.Queue()
    done = threading.Event()

    def produce() -> None:
        try:
            for bucket in range(staged.layout.num_buckets):
                while not slots.acquire(timeout=0.1):
                    if done.is_set():
                        return
                    _check_open(closed)
                _check_open(closed)
                ready.put(_bucket_chunks(staged, bucket, chunk_bytes))
            ready.put(None)
        except BaseException as exc:   # handed to the sending thread, which fails the RPC
            ready.put(exc)

    threading.Thread(target=produce, name=f"bucketed-prepare-v{staged.manifest.version}", daemon=True).start()
    try:
        while True:
            item = ready.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            item.reverse()
            while item:                            # each chunk is dropped once sent, so is the bucket
                _check_open(closed)
                yield item.pop()
            slots.release()
    finally:
        done.set()


class _WeightStreamServicer(weight_sync_pb2_grpc.WeightStreamServicer):
    def __init__(self, sender: BucketedSender) -> None:
        self._sender = sender

    def Fetch(self, request: weight_sync_pb2.FetchRequest,  # noqa: N802 (gRPC method name)
              context: grpc.ServicerContext) -> Iterator[weight_sync_pb2.WeightChunk]:
        staged = self._sender._lookup(request.version)
        if staged is None:
            context.abort(grpc.StatusCode.NOT_FOUND,
                          f"weight version {request.version} is not staged here (staged: {self._sender._versions()})")
        log.debug("streaming version %d to %s at %s", request.version, request.replica_id or "a caller",
                  context.peer())
        assert staged is not None                          # context.abort raised otherwise
        try:
            yield from stream_buckets(staged, self._sender.chunk_bytes, self._sender._closed)
        except ConnectionAbortedError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"{exc} (version {request.version})")


def _advertised_host(host: str) -> str:
    return socket.gethostname() if host in ("", "0.0.0.0", "[::]", "::") else host


class BucketedSender:
    """Holds the last `keep_versions` staged versions in host memory and serves them over WeightStream.Fetch.

    `bind` may use port 0; `endpoint` is the address actually bound (a wildcard host is advertised as this
    machine's hostname).
    """

    def __init__(self, bind: str, token: Credential, bucket_bytes: int, chunk_bytes: int = 1 << 20,
                 keep_versions: int = 2) -> None:
        if not 0 < chunk_bytes <= _CHUNK_LIMIT:
            raise ValueError(f"chunk_bytes must be in (0, {_CHUNK_LIMIT}], got {chunk_bytes}")
        if keep_versions < 1:
            raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
        self.bucket_bytes = aligned_bucket_bytes(bucket_bytes)
        self.chunk_bytes = chunk_bytes
        self.keep_versions = keep_versions
        self._lock = threading.Lock()
        self._staged: OrderedDict[int, StagedVersion] = OrderedDict()
        self._closed = threading.Event()
        self._server = Server(bind, token)
        self._server.add(weight_sync_pb2_grpc.add_WeightStreamServicer_to_server, _WeightStreamServicer(self),
                         "rlfleet.v1.WeightStream")
        self._server.start()
        self._endpoint = f"{_advertised_host(bind.rpartition(':')[0])}:{self._server.port}"

    @property
    def endpoint(self) -> str:
        return self._endpoint

    def stage(self, version: int, step: int,
              named_tensors: Iterable[tuple[str, torch.Tensor]]) -> weights_pb2.WeightManifest:
        """Copy the tensors into buckets (a snapshot: later changes to them are not sent); return the manifest."""
        if self._closed.is_set():
            raise RuntimeError("BucketedSender is closed")
        staged = stage_tensors(version, step, named_tensors, self.bucket_bytes, self._endpoint)
        self.put(staged)
        manifest = weights_pb2.WeightManifest()
        manifest.CopyFrom(staged.manifest)
        return manifest

    def put(self, staged: StagedVersion) -> None:
        """Serve a version another sender already laid out (the broadcast transport's gRPC fallback)."""
        if self._closed.is_set():
            raise RuntimeError("BucketedSender is closed")
        version = staged.manifest.version
        with self._lock:
            self._staged.pop(version, None)
            self._staged[version] = staged
            while len(self._staged) > self.keep_versions:
                self._staged.popitem(last=False)   # a Fetch already streaming an evicted version keeps its reference

    def close(self) -> None:
        """Stop serving now (streams in flight fail) and drop the staged versions."""
        self._closed.set()
        self._server.stop(grace=0)
        with self._lock:
            self._staged.clear()

    def _lookup(self, version: int) -> StagedVersion | None:
        with self._lock:
            return self._staged.get(version)

    def _versions(self) -> list[int]:
        with self._lock:
            return list(self._staged)
