"""A flipped bit anywhere in the embedded log: the buffer refuses to start naming the damaged commit's offset (and
`rlfleet buffer verify` fails), or it recovers every acknowledged commit; it never serves with less.

The sweep flips one bit (chosen by a fixed seed) of every byte of a small log the real store wrote, once as a
cleanly closed log and once as a crashed one (zeros written ahead of the log still after it), and opens the store
in-process for each."""

from __future__ import annotations

import random
import struct
from pathlib import Path

from rlfleet.services.buffer.mutations import Add, Close, Issue, Mutation
from rlfleet.services.buffer.state import State
from rlfleet.services.buffer.stores.embedded import LOG_NAME, EmbeddedStore, LogCorrupt
from rlfleet.services.buffer.stores.repair import verify
from tests.unit.test_buffer_durability import fingerprint

SEED = 41
ZEROS_KEPT = 64 << 10      # of the zeros a crashed log has ahead of it (all of them make the sweep 50 times slower)


def _write_log(directory: Path, close: bool) -> tuple[State, bytes, int]:
    """Three acknowledged commits (fsync always); the log's bytes and where its commits end."""
    store = EmbeddedStore(directory, fsync="always")
    state = store.load()
    for g in range(3):
        gid = f"g{g}"
        muts: list[Mutation] = [Issue(gid, g, 2, 1e9, "r"),
                                Add(gid, 0, 3 * g + 1, 0, 1, 0.5, bytes(range(g, g + 24))),
                                Add(gid, 1, 3 * g + 2, 0, 1, 1.0, b"\x00\x01" * 8),
                                Close(gid, (0, 1), 3 * g + 3, {}, ())]
        store.commit(muts, state)
        for m in muts:
            state.apply(m)
    end = store.log_bytes
    live = (directory / LOG_NAME).read_bytes()           # the zeros written ahead of the log are still there
    store.close()
    assert len(live) > end + ZEROS_KEPT and live[end:] == bytes(len(live) - end)
    return state, (directory / LOG_NAME).read_bytes() if close else live[:end + ZEROS_KEPT], end


def _frame_starts(data: bytes, end: int) -> list[int]:
    """Where each commit frame starts ([magic][u32 length][u32 crc][body]), read here from the header layout."""
    starts, pos = [], 0
    while pos < end:
        starts.append(pos)
        pos += 12 + struct.unpack_from("<I", data, pos + 4)[0]
    assert pos == end
    return starts


def _sweep(tmp_path: Path, close: bool) -> dict[str, int]:
    run_dir = tmp_path / "run"
    directory = run_dir / "buffer"
    want, data, end = _write_log(directory, close)
    want_print = fingerprint(want)
    starts = _frame_starts(data, end)
    path = directory / LOG_NAME
    rng = random.Random(SEED)
    outcomes = {"refused": 0, "recovered": 0}
    for at in range(end):                                    # every byte of every commit
        damaged = bytearray(data)
        damaged[at] ^= 1 << rng.randrange(8)
        for side in directory.glob(f"{LOG_NAME}.*"):
            side.unlink()
        path.write_bytes(bytes(damaged))
        frame = max(s for s in starts if s <= at)
        store = EmbeddedStore(directory, fsync="always")
        try:
            got = store.load()
        except LogCorrupt as exc:
            assert f"offset {frame}" in str(exc), f"byte {at}: the error names no offset of its commit: {exc}"
            assert path.read_bytes() == bytes(damaged), f"byte {at}: refused, yet the log was changed"
            report = verify(run_dir)
            assert not report.ok and f"offset {frame}" in report.text, f"byte {at}: verify passes:\n{report.text}"
            outcomes["refused"] += 1
            continue
        finally:
            store.close()
        assert fingerprint(got) == want_print, f"byte {at} (commit at {frame}): served with less, silently"
        outcomes["recovered"] += 1
    return outcomes


def test_a_flipped_bit_in_any_byte_of_a_closed_log_is_refused_or_recovered(tmp_path: Path) -> None:
    outcomes = _sweep(tmp_path, close=True)
    print(f"\nclosed log, one flipped bit per byte: {outcomes}")
    assert outcomes["refused"] > 0


def test_a_flipped_bit_in_any_byte_of_a_crashed_log_is_refused_or_recovered(tmp_path: Path) -> None:
    outcomes = _sweep(tmp_path, close=False)
    print(f"\ncrashed log (zeros ahead of it), one flipped bit per byte: {outcomes}")
    assert outcomes["refused"] > 0


def test_a_flipped_magic_of_the_first_commit_is_not_taken_for_the_old_format(tmp_path: Path) -> None:
    """The first four bytes with a flipped bit: once taken for the old format, the whole log was cut as its torn
    tail, rewritten with no copy kept, and the buffer served nothing while verify passed."""
    run_dir = tmp_path / "run"
    _, data, _ = _write_log(run_dir / "buffer", close=True)
    path = run_dir / "buffer" / LOG_NAME
    for at in range(4):
        path.write_bytes(data[:at] + bytes([data[at] ^ 0x04]) + data[at + 1:])
        store = EmbeddedStore(run_dir / "buffer")
        try:
            store.load()
            raise AssertionError(f"byte {at}: the store started")
        except LogCorrupt as exc:
            assert "corrupt frame at offset 0" in str(exc)
        finally:
            store.close()
        assert len(path.read_bytes()) == len(data) and not verify(run_dir).ok


def test_a_zero_filled_last_byte_is_a_torn_write_even_where_one_bit_explains_it(tmp_path: Path) -> None:
    """The last commit ends in a byte with one bit set; a write that stopped just before it and was zero-filled
    differs from it by that one bit: as well explained by the torn write (never acknowledged), so it is cut."""
    store = EmbeddedStore(tmp_path, fsync="always")
    state = store.load()
    first: list[Mutation] = [Issue("g0", 0, 2, 1e9, "r")]
    store.commit(first, state)
    state.apply(first[0])
    want = fingerprint(state)
    store.commit([Add("g0", 0, 1, 0, 1, 0.5, b"abc\x01")], state)
    store.close()
    path = tmp_path / LOG_NAME
    data = path.read_bytes()
    assert data[-1] == 0x01
    path.write_bytes(data[:-1] + b"\0")
    store = EmbeddedStore(tmp_path)
    assert fingerprint(store.load()) == want
    store.close()
