"""Bucketed transport over real gRPC on loopback: bit-identical round trips, versions, corruption, auth."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch

from rlfleet.runtime.rpc import Server, channel
from rlfleet.services.weight_sync.transports import get_receiver
from rlfleet.services.weight_sync.transports.bucketed import BucketedSender, WeightTransferError, fetch
from rlfleet.services.weight_sync.transports.bucketed.receiver import StreamReceiver, receive
from rlfleet.services.weight_sync.transports.layout import layout_of
from rlfleet.services.weight_sync.transports.manifest import manifest_digest, manifest_pairs, tensor_bytes
from rlfleet.v1 import weight_sync_pb2, weight_sync_pb2_grpc, weights_pb2

torch.set_num_threads(1)
TOKEN = "test-run-token"


def named_tensors(seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        ("embed.weight", torch.randn(40, 9, generator=g)),                         # 1440 B: several buckets
        ("norm.weight", torch.randn(7, generator=g).to(torch.bfloat16)),
        ("step_count", torch.randint(-2**40, 2**40, (5,), generator=g)),
        ("empty", torch.empty(0, 3)),
        ("scalar", torch.tensor(float(seed) + 0.5)),                              # 0-dim
        ("proj.weight", torch.randn(6, 11, generator=g).to(torch.bfloat16).t()),  # non-contiguous input
        ("mask", torch.rand(13, generator=g) > 0.5),
        ("half", torch.randn(3, 3, generator=g).half()),
        ("bias", torch.randn(37, generator=g)),                                   # straddles bucket ends
        ("big.weight", torch.randn(300, generator=g)),                            # bigger than one bucket
    ]


def assert_bit_identical(sent: list[tuple[str, torch.Tensor]], got: list[tuple[str, torch.Tensor]]) -> None:
    assert [n for n, _ in got] == [n for n, _ in sent]
    for (name, a), (_, b) in zip(sent, got, strict=True):
        assert b.dtype == a.dtype and b.shape == a.shape, name
        assert bytes(tensor_bytes(b)) == bytes(tensor_bytes(a)), name


@pytest.fixture
def sender() -> Iterator[BucketedSender]:
    s = BucketedSender("127.0.0.1:0", TOKEN, bucket_bytes=256, chunk_bytes=100)
    yield s
    s.close()


def test_round_trip_is_bit_identical_across_dtypes_and_bucket_ends(sender: BucketedSender) -> None:
    sent = named_tensors(0)
    manifest = sender.stage(1, 10, sent)
    assert manifest.transport == "bucketed" and manifest.endpoint == sender.endpoint
    assert manifest.num_buckets > 5 and manifest.bucket_bytes == 256
    straddling = [e.name for e in manifest.tensors if e.nbytes and e.offset + e.nbytes > manifest.bucket_bytes]
    assert "big.weight" in straddling and len(straddling) >= 2
    assert {e.dtype for e in manifest.tensors} == {"float32", "bfloat16", "int64", "bool", "float16"}
    got = get_receiver("bucketed")(manifest, TOKEN, 10.0, "replica-0")
    assert_bit_identical(sent, got)


def test_buckets_hold_one_dtype_each(sender: BucketedSender) -> None:
    manifest = sender.stage(1, 0, named_tensors(0))
    dtype_of_bucket: dict[int, str] = {}
    layout = layout_of(manifest)
    for e, p in zip(manifest.tensors, layout.placements, strict=True):
        b, off, left = p.bucket, p.offset, p.nbytes
        while left:
            assert dtype_of_bucket.setdefault(b, e.dtype) == e.dtype
            left -= min(left, manifest.bucket_bytes - off)
            b, off = b + 1, 0


def test_three_consecutive_versions_and_eviction(sender: BucketedSender) -> None:
    manifests = []
    for v in (1, 2, 3):
        sent = named_tensors(v)
        manifests.append(sender.stage(v, v * 10, sent))
        assert_bit_identical(sent, fetch(manifests[-1], TOKEN, 10.0))
    assert len({m.digest for m in manifests}) == 3
    assert_bit_identical(named_tensors(2), fetch(manifests[1], TOKEN, 10.0))    # keep_versions=2: v2 still there
    with pytest.raises(WeightTransferError, match="NOT_FOUND"):
        fetch(manifests[0], TOKEN, 10.0)                                          # v1 evicted


def test_replicas_fetch_the_same_version_concurrently(sender: BucketedSender) -> None:
    sent = named_tensors(5)
    manifest = sender.stage(5, 0, sent)
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda r: fetch(manifest, TOKEN, 30.0, f"r{r}"), range(3)))
    for got in results:
        assert_bit_identical(sent, got)


class _CountingRelay:
    """A TCP relay on loopback to the sender's port that counts the connections made through it: one client
    connection is one accepted socket here, whatever ephemeral port the client got (ports may be reused)."""

    def __init__(self, upstream: str) -> None:
        self.accepted = 0
        self._upstream = upstream.rpartition(":")[2]
        self._server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            self.accepted += 1
            upstream = socket.create_connection(("127.0.0.1", int(self._upstream)))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def via(self, manifest: weights_pb2.WeightManifest) -> weights_pb2.WeightManifest:
        out = weights_pb2.WeightManifest()
        out.CopyFrom(manifest)
        out.endpoint = self.endpoint
        return out

    def close(self) -> None:
        self._server.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def test_a_replica_keeps_one_connection_from_version_to_version(sender: BucketedSender) -> None:
    relay = _CountingRelay(sender.endpoint)
    receiver = StreamReceiver()
    try:
        manifests = [sender.stage(v, v, named_tensors(v)) for v in (1, 2, 3)]     # keeps 2: version 1 is gone
        for v, manifest in zip((2, 3, 2), manifests[1:] + manifests[1:2], strict=True):
            assert_bit_identical(named_tensors(v), receiver.fetch(relay.via(manifest), TOKEN, 10.0, "replica-0"))
        kept = relay.accepted
        with pytest.raises(WeightTransferError, match="NOT_FOUND"):      # a failed fetch drops the channel ...
            receiver.fetch(relay.via(manifests[0]), TOKEN, 10.0, "replica-0")
        assert_bit_identical(named_tensors(3), receiver.fetch(relay.via(sender.stage(3, 3, named_tensors(3))),
                                                              TOKEN, 10.0))            # ... and the next one works
    finally:
        receiver.close()
        relay.close()
    assert kept == 1                        # three versions over one connection
    # (whether a fresh channel opens a fresh connection is gRPC's choice: it may share a subchannel it still holds)


def test_version_of_only_empty_tensors_has_no_buckets(sender: BucketedSender) -> None:
    sent = [("a", torch.empty(0)), ("b", torch.empty(2, 0, dtype=torch.bfloat16))]
    manifest = sender.stage(1, 0, sent)
    assert manifest.num_buckets == 0 and manifest.total_bytes == 0
    assert_bit_identical(sent, fetch(manifest, TOKEN, 10.0))


def test_stage_takes_a_snapshot(sender: BucketedSender) -> None:
    w = torch.zeros(100)
    manifest = sender.stage(1, 0, [("w", w)])
    w += 1.0
    (name, got), = fetch(manifest, TOKEN, 10.0)
    assert torch.equal(got, torch.zeros(100))


def test_unknown_version_is_not_found_and_no_token_is_unauthenticated(sender: BucketedSender) -> None:
    sender.stage(1, 0, named_tensors(0))
    with channel(sender.endpoint, TOKEN) as ch:
        stub = weight_sync_pb2_grpc.WeightStreamStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Fetch(weight_sync_pb2.FetchRequest(version=7), timeout=10))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with channel(sender.endpoint, None) as ch:
        stub = weight_sync_pb2_grpc.WeightStreamStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Fetch(weight_sync_pb2.FetchRequest(version=1), timeout=10))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_wrong_token_raises_transfer_error(sender: BucketedSender) -> None:
    manifest = sender.stage(1, 0, named_tensors(0))
    with pytest.raises(WeightTransferError, match="UNAUTHENTICATED"):
        fetch(manifest, "wrong-token", 10.0)


def _with_entry_hash(manifest: weights_pb2.WeightManifest, name: str, xxh64: str) -> weights_pb2.WeightManifest:
    out = weights_pb2.WeightManifest()
    out.CopyFrom(manifest)
    next(e for e in out.tensors if e.name == name).xxh64 = xxh64
    out.digest = manifest_digest(manifest_pairs(out))       # a self-consistent manifest that lies about one tensor
    return out


def test_wrong_tensor_hash_in_manifest_raises(sender: BucketedSender) -> None:
    manifest = sender.stage(1, 0, named_tensors(0))
    with pytest.raises(WeightTransferError, match="checksum mismatch.*bias"):
        fetch(_with_entry_hash(manifest, "bias", "0123456789abcdef"), TOKEN, 10.0)


def test_wrong_manifest_digest_raises(sender: BucketedSender) -> None:
    manifest = sender.stage(1, 0, named_tensors(0))
    manifest.digest = "0" * 16
    with pytest.raises(WeightTransferError, match="digest"):
        fetch(manifest, TOKEN, 10.0)


ChunkEdit = Callable[[list[weight_sync_pb2.WeightChunk]], Iterable[weight_sync_pb2.WeightChunk]]


class _Relay(weight_sync_pb2_grpc.WeightStreamServicer):
    """A WeightStream that relays the real sender's chunks through `edit` (a faulty or malicious sender)."""

    def __init__(self, upstream: str, edit: ChunkEdit) -> None:
        self._upstream, self._edit = upstream, edit

    def Fetch(self, request, context):  # noqa: N802, ANN001, ANN201
        with channel(self._upstream, TOKEN) as ch:
            chunks = list(weight_sync_pb2_grpc.WeightStreamStub(ch).Fetch(request, timeout=10))
        yield from self._edit(chunks)


def _flip_byte(chunks: list[weight_sync_pb2.WeightChunk]) -> list[weight_sync_pb2.WeightChunk]:
    c = chunks[len(chunks) // 2]
    c.data = bytes([c.data[0] ^ 0x01]) + c.data[1:]
    return chunks


@pytest.mark.parametrize(("edit", "match"), [
    (lambda cs: cs[:-1], "truncated"),                                        # ends early, status OK
    (lambda cs: [c for c in cs if c.bucket != 1], "truncated.*1"),            # a bucket never sent
    (lambda cs: [c for i, c in enumerate(cs) if i != 1], "offset"),           # a chunk lost in the middle
    (lambda cs: cs[:1] + [weight_sync_pb2.WeightChunk(version=cs[0].version, bucket=cs[0].bucket,
                                                      offset=len(cs[0].data), data=b"\0" * 999, last=True)],
     "size mismatch"),
    (_flip_byte, "checksum mismatch"),
    (lambda cs: [weight_sync_pb2.WeightChunk(version=99, bucket=0, data=b"x")], "version 99"),
])
def test_faulty_stream_raises_before_returning_anything(sender: BucketedSender, edit: ChunkEdit, match: str) -> None:
    manifest = sender.stage(1, 0, named_tensors(0))
    relay = Server("127.0.0.1:0", TOKEN)
    relay.add(weight_sync_pb2_grpc.add_WeightStreamServicer_to_server, _Relay(sender.endpoint, edit), "relay")
    relay.start()
    try:
        manifest.endpoint = f"127.0.0.1:{relay.port}"
        with pytest.raises(WeightTransferError, match=match):
            fetch(manifest, TOKEN, 10.0)
    finally:
        relay.stop(grace=0)


def test_sender_closed_mid_stream_raises() -> None:
    sender = BucketedSender("127.0.0.1:0", TOKEN, bucket_bytes=1 << 20, chunk_bytes=64 << 10)
    try:
        manifest = sender.stage(1, 0, [("w", torch.arange(8 << 20, dtype=torch.float32))])   # 32 MB, 32 buckets
        layout = layout_of(manifest)
        received = []

        def close_after_first(chunks: Iterable[weight_sync_pb2.WeightChunk]) -> Iterator[weight_sync_pb2.WeightChunk]:
            for c in chunks:
                received.append(c.bucket)
                if len(received) == 1:
                    sender.close()
                yield c

        with channel(sender.endpoint, TOKEN) as ch:
            call = weight_sync_pb2_grpc.WeightStreamStub(ch).Fetch(weight_sync_pb2.FetchRequest(version=1), timeout=10)
            with pytest.raises(WeightTransferError, match="CANCELLED|UNAVAILABLE"):
                receive(manifest, layout, close_after_first(call))
        assert 0 < len(received) < 32 * 16                           # 512 chunks in all: it ended mid-stream
    finally:
        sender.close()
    with pytest.raises(WeightTransferError, match="UNAVAILABLE"):
        fetch(manifest, TOKEN, 5.0)                                   # and a closed sender cannot be reached


def test_unknown_transport_name() -> None:
    with pytest.raises(ValueError, match="unknown weight transport 'nope'"):
        get_receiver("nope")
