"""A commit frame copied in the embedded log (at its tail or in the middle) is never applied twice: every commit
carries its sequence number, replay refuses one that is not the next (`rlfleet buffer verify` reports it) and salvage
drops the copy, keeping every acknowledged commit. Before sequence numbers, the copy was replayed again silently (its
samples counted twice) and verify called the log intact."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from rlfleet.services.buffer.mutations import Add, Issue, Mutation
from rlfleet.services.buffer.state import State
from rlfleet.services.buffer.stores.embedded import LOG_NAME, EmbeddedStore, LogCorrupt
from rlfleet.services.buffer.stores.repair import salvage, verify
from tests.unit.test_buffer_durability import fingerprint

_HEAD = struct.Struct("<4sII")      # the frame header, from its documented layout: magic, body length, crc32


def _frames(data: bytes) -> list[bytes]:
    """The log's frames as bytes, split by their headers (written here, not taken from the code under test)."""
    out, pos = [], 0
    while pos < len(data):
        _, length, _ = _HEAD.unpack_from(data, pos)
        out.append(data[pos:pos + _HEAD.size + length])
        pos += _HEAD.size + length
    return out


def _first_record(frame: bytes) -> dict[str, object]:
    """The JSON header of a frame's first record: body = [u32 record length][u32 header length][header]..."""
    body = frame[_HEAD.size:]
    (header_len,) = struct.unpack_from("<I", body, 4)
    return dict(json.loads(body[8:8 + header_len]))


def _write_log(directory: Path, groups: int) -> State:
    """A log of `groups` commits, each a claimed group and one sample; returns the state it holds."""
    store, want = EmbeddedStore(directory), State()
    state = store.load()
    for g in range(groups):
        muts: list[Mutation] = [Issue(f"g{g}", g, 2, 1e9, "r"), Add(f"g{g}", 0, g + 1, 0, 1, 0.5, bytes([g]) * 8)]
        store.commit(muts, state)
        for m in muts:
            state.apply(m)
            want.apply(m)
    store.close()
    return want


@pytest.mark.parametrize("where", ["tail", "middle"])
def test_a_duplicated_frame_is_never_applied_twice(tmp_path: Path, where: str) -> None:
    run_dir = tmp_path / "run"
    buffer_dir = run_dir / "buffer"
    want = _write_log(buffer_dir, 4)
    path = buffer_dir / LOG_NAME
    frames = _frames(path.read_bytes())
    k = 3 if where == "tail" else 1
    path.write_bytes(b"".join([*frames[:k + 1], frames[k], *frames[k + 1:]]))

    with pytest.raises(LogCorrupt, match=f"repeats commit {k}"):
        EmbeddedStore(buffer_dir).load()
    assert len(_frames(path.read_bytes())) == 5                 # refused: nothing cut
    report = verify(run_dir)
    assert not report.ok and f"repeats commit {k}" in report.text and "duplicated frame" in report.text

    report = salvage(run_dir)
    assert report.ok and f"repeats commit {k}" in report.text
    store = EmbeddedStore(buffer_dir)
    state = store.load()
    assert fingerprint(state) == fingerprint(want)               # each sample once, none lost
    assert state.put_samples == 4
    store.commit([Issue("g9", 9, 2, 1e9, "r")], state)          # the salvaged log goes on numbered
    store.close()
    assert verify(run_dir).ok
    assert [_first_record(f) for f in _frames(path.read_bytes())] == [{"t": "Seq", "n": 0}, {"t": "Seq", "n": 1}]


def test_a_missing_frame_is_reported_as_missing_commits(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _write_log(run_dir / "buffer", 4)
    path = run_dir / "buffer" / LOG_NAME
    frames = _frames(path.read_bytes())
    path.write_bytes(b"".join([*frames[:2], *frames[3:]]))
    report = verify(run_dir)
    assert not report.ok and "commit 2 is missing" in report.text
    with pytest.raises(LogCorrupt, match="missing"):
        EmbeddedStore(run_dir / "buffer").load()
