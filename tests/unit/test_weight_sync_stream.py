"""Double buffering of the bucketed sender: bucket i+1 is prepared while bucket i is sent, never more."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from rlfleet.services.weight_sync.transports.bucketed import sender as bucketed_sender
from rlfleet.services.weight_sync.transports.bucketed.sender import stage_tensors, stream_buckets

torch.set_num_threads(1)


def wait_until(cond, timeout: float = 5.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


@pytest.fixture
def prepared(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Buckets whose chunks the sender has prepared, in order."""
    seen: list[int] = []
    real = bucketed_sender._bucket_chunks

    def counting(staged, bucket, chunk_bytes):  # noqa: ANN001, ANN202
        seen.append(bucket)
        return real(staged, bucket, chunk_bytes)

    monkeypatch.setattr(bucketed_sender, "_bucket_chunks", counting)
    return seen


def test_next_bucket_is_prepared_while_one_is_sent(prepared: list[int]) -> None:
    staged = stage_tensors(3, 0, [("w", torch.arange(64, dtype=torch.float32))], bucket_bytes=64, endpoint="x:1")
    assert staged.layout.num_buckets == 4
    stream = stream_buckets(staged, chunk_bytes=32, closed=threading.Event())
    first = next(stream)                                    # bucket 0 is being sent
    assert (first.bucket, first.offset, first.version) == (0, 0, 3)
    assert wait_until(lambda: prepared == [0, 1])           # bucket 1 prepared in the background
    time.sleep(0.2)
    assert prepared == [0, 1]                               # but not bucket 2: two buckets in memory at most
    rest = list(stream)
    assert prepared == [0, 1, 2, 3]
    chunks = [first, *rest]
    assert [(c.bucket, c.offset, c.last) for c in chunks] == [(b, o, o == 32) for b in range(4) for o in (0, 32)]
    assert b"".join(c.data for c in chunks) == torch.arange(64, dtype=torch.float32).numpy().tobytes()


def test_closing_the_sender_fails_a_waiting_stream(prepared: list[int]) -> None:
    staged = stage_tensors(1, 0, [("w", torch.zeros(64))], bucket_bytes=64, endpoint="x:1")
    closed = threading.Event()
    stream = stream_buckets(staged, chunk_bytes=64, closed=closed)
    next(stream)
    assert wait_until(lambda: len(prepared) == 2)
    closed.set()
    with pytest.raises(ConnectionAbortedError):
        list(stream)
