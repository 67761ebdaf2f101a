"""Buffer.Put requests encoded from serialized Samples: each sample's bytes framed as field 1 of PutRequest (tag +
length + bytes). A parser reads the result exactly as PutRequest(samples=[...], wait_seconds=...); building that
message and serializing it costs ~8x more for large samples (the protobuf runtime re-encodes each nested sample),
and a sample already serialized is never parsed or copied into a message again."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

import grpc

from rlfleet.v1 import buffer_pb2

PUT_METHOD = "/rlfleet.v1.Buffer/Put"
_SAMPLES_TAG = b"\x0a"        # PutRequest.samples: field 1, wire type 2 (length-delimited)
_WAIT_TAG = b"\x11"           # PutRequest.wait_seconds: field 2, wire type 1 (64-bit)
_DOUBLE = struct.Struct("<d")


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_put_request(samples: Sequence[bytes], wait_seconds: float = 0.0) -> bytes:
    """The wire form of PutRequest(samples=[Sample.FromString(s) for s in samples], wait_seconds=wait_seconds)."""
    parts: list[bytes] = []
    for data in samples:
        parts += (_SAMPLES_TAG, varint(len(data)), data)
    if wait_seconds:
        parts += (_WAIT_TAG, _DOUBLE.pack(wait_seconds))
    return b"".join(parts)


RawPut = Callable[..., buffer_pb2.PutReply]     # (encoded PutRequest, timeout=...) -> PutReply


def raw_put(channel: grpc.Channel) -> RawPut:
    """Buffer.Put on channel taking an encoded PutRequest (encode_put_request) instead of a message."""
    return channel.unary_unary(PUT_METHOD, request_serializer=None,
                               response_deserializer=buffer_pb2.PutReply.FromString)
