"""Byte-level fast paths of the buffer: Batch replies framed from stored bytes, Put requests framed from serialized
samples, log records written as parts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from google.protobuf.internal.encoder import _VarintBytes

from rlfleet.sample.put_wire import encode_put_request, varint
from rlfleet.services.buffer.mutations import Add, Close, Counters, Issue, Mutation, encode
from rlfleet.services.buffer.stores.embedded import _body, _body_parts
from rlfleet.services.buffer.stores.logfile import AppendLog, frame, frame_parts, read_records
from rlfleet.services.buffer.wire import encode_batch
from rlfleet.v1 import buffer_pb2, sample_pb2


def sample(index: int, tokens: int) -> bytes:
    return sample_pb2.Sample(group_id="g3", index=index, group_size=2, prompt_index=3,
                             response_ids=np.arange(tokens, dtype="<i4").tobytes(),
                             rollout_logprobs=np.zeros(tokens, "<f4").tobytes(), reward=0.5).SerializeToString()


def test_varint_matches_protobuf() -> None:
    for n in (0, 1, 127, 128, 300, 16383, 16384, 65 << 10, 2 ** 32, 2 ** 63):
        assert varint(n) == _VarintBytes(n)


def test_encoded_batch_parses_as_the_batch_message() -> None:
    raws = [sample(0, 3), sample(1, 40_000)]          # one length needs a 3-byte varint
    got = buffer_pb2.Batch.FromString(encode_batch(7, raws, ["g3"], True, True))
    want = buffer_pb2.Batch(step=7, samples=[sample_pb2.Sample.FromString(r) for r in raws], group_ids=["g3"],
                            complete=True, redelivered=True)
    assert got == want
    assert buffer_pb2.Batch.FromString(encode_batch(0, [], [], False, False)) == buffer_pb2.Batch()


def test_encoded_put_request_parses_as_the_put_message() -> None:
    raws = [sample(0, 3), sample(1, 40_000)]
    got = buffer_pb2.PutRequest.FromString(encode_put_request(raws, 2.5))
    assert got == buffer_pb2.PutRequest(samples=[sample_pb2.Sample.FromString(r) for r in raws], wait_seconds=2.5)
    assert [m.SerializeToString() for m in got.samples] == raws
    assert encode_put_request([], 0.0) == b"" and buffer_pb2.PutRequest.FromString(b"") == buffer_pb2.PutRequest()


def test_encoded_batch_carries_the_folded_ack_count() -> None:
    got = buffer_pb2.Batch.FromString(encode_batch(4, [sample(0, 2)], ["g3"], True, False, acked_samples=9))
    assert (got.step, got.acked_samples, got.redelivered, len(got.samples)) == (4, 9, False, 1)


def test_headers_keep_their_format() -> None:
    assert encode(Add("g1", 2, 7, 3, 1, -0.25, b"\x00")) == (
        b'{"gid":"g1","index":2,"seq":7,"weight_version":3,"status":1,"reward":-0.25,"t":"Add"}', b"\x00")
    assert encode(Close("g1", (0, 2), 9, {"failed": 1}, (5,)))[0] == (
        b'{"gid":"g1","kept":[0,2],"seq":9,"drops":{"failed":1},"drop_seqs":[5],"t":"Close"}')


def test_framed_parts_are_the_framed_body(tmp_path: Path) -> None:
    muts: list[Mutation] = [Issue("g1", 1, 2, 1.5, "r"), Add("g1", 0, 1, 0, 1, 0.0, b"x" * 70_000),
                            Counters(2, 1, 1, 0, 0, -1, 0, {})]
    for m in muts:
        assert b"".join(frame_parts(_body_parts(m))) == frame(_body(m))
    log = AppendLog(tmp_path / "log", 0)
    log.append_buffers([buf for m in muts for buf in frame_parts(_body_parts(m))])
    log.append([_body(muts[0])])
    log.close()
    bodies, valid = read_records(tmp_path / "log")
    assert bodies == [_body(m) for m in [*muts, muts[0]]] and valid == (tmp_path / "log").stat().st_size


def test_more_buffers_than_one_writev_takes(tmp_path: Path) -> None:
    log = AppendLog(tmp_path / "log", 0)
    bodies = [bytes([i % 256]) * (i % 7) for i in range(1500)]       # empty bodies too
    log.append_buffers([buf for b in bodies for buf in frame_parts([b])])
    log.close()
    assert read_records(tmp_path / "log")[0] == bodies
