"""What the embedded store does with a log it did not write as it is: the old format (rewritten, the original kept
beside it), an all-zero file (the store, verify and salvage agree), a corrupt log (refused at once, no retries)."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest

from rlfleet.config import load_config
from rlfleet.services.buffer.mutations import Add, Close, Issue, Mutation, encode
from rlfleet.services.buffer.server import build_core
from rlfleet.services.buffer.state import State
from rlfleet.services.buffer.stores.embedded import LOG_NAME, EmbeddedStore, LogCorrupt
from rlfleet.services.buffer.stores.logfile import MAGIC
from rlfleet.services.buffer.stores.repair import salvage, verify
from tests.integration.test_buffer_service import write_config
from tests.unit.test_buffer_durability import fingerprint


def _mutations() -> list[Mutation]:
    return [Issue("g0", 0, 2, 1e9, "r"), Add("g0", 0, 1, 0, 1, 0.5, b"abc"), Add("g0", 1, 2, 0, 1, 1.0, b"de"),
            Close("g0", (0, 1), 3, {}, ())]


def _legacy_log(mutations: list[Mutation]) -> bytes:
    """The format before commit frames, written here from its layout: [u32 length][u32 crc32(body)][body], one
    mutation per frame, body = [u32 header length][JSON header][payload]."""
    out = b""
    for m in mutations:
        header, payload = encode(m)
        body = struct.pack("<I", len(header)) + header + payload
        out += struct.pack("<II", len(body), zlib.crc32(body)) + body
    return out


def test_an_old_format_log_is_rewritten_and_the_original_kept_beside_it(tmp_path: Path) -> None:
    want = State()
    for m in _mutations():
        want.apply(m)
    old = _legacy_log(_mutations())
    (tmp_path / LOG_NAME).write_bytes(old)
    store = EmbeddedStore(tmp_path)
    assert fingerprint(store.load()) == fingerprint(want)
    store.close()
    assert (tmp_path / f"{LOG_NAME}.legacy-0").read_bytes() == old
    assert (tmp_path / LOG_NAME).read_bytes()[:4] == MAGIC
    assert fingerprint(EmbeddedStore(tmp_path).load()) == fingerprint(want)


def test_an_all_zero_log_starts_empty_and_verify_and_salvage_agree(tmp_path: Path) -> None:
    """No commit ever completed in it (space written ahead of the first one): it once could neither start (read as
    the old format, its empty frames did not replay) nor be salvaged, while verify said to salvage it."""
    run_dir = tmp_path / "run"
    (run_dir / "buffer").mkdir(parents=True)
    (run_dir / "buffer" / LOG_NAME).write_bytes(bytes(8192))
    report = verify(run_dir)
    assert report.ok and "torn tail of 8192 bytes at offset 0" in report.text
    assert salvage(run_dir).ok
    store = EmbeddedStore(run_dir / "buffer")
    assert fingerprint(store.load()) == fingerprint(State())
    store.close()
    assert (run_dir / "buffer" / LOG_NAME).stat().st_size == 0


def test_a_corrupt_log_is_refused_at_once_not_retried(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run_dir = tmp_path / "run"
    cfg = load_config(write_config(run_dir, 1))
    store = EmbeddedStore(run_dir / "buffer")
    state = store.load()
    for g in range(3):
        muts: list[Mutation] = [Issue(f"g{g}", g, 2, 1e9, "r")]
        store.commit(muts, state)
        state.apply(muts[0])
    store.close()
    path = run_dir / "buffer" / LOG_NAME
    data = bytearray(path.read_bytes())
    data[20] ^= 0x01                                    # inside the first commit: intact ones follow
    path.write_bytes(bytes(data))
    with caplog.at_level("WARNING"), pytest.raises(LogCorrupt, match="corrupt frame at offset 0"):
        build_core(cfg, patience=5.0)           # (it used to retry for the whole patience)
    assert "retrying" not in caplog.text


def _unsequenced_log(mutations: list[Mutation]) -> bytes:
    """The commit-frame format before sequence numbers, written here from its layout: one frame per mutation,
    [b"RLFC"][u32 length][u32 crc32(length bytes + body)][body], body = [u32 record length][record], record =
    [u32 header length][JSON header][payload]."""
    out = b""
    for m in mutations:
        header, payload = encode(m)
        record = struct.pack("<I", len(header)) + header + payload
        body = struct.pack("<I", len(record)) + record
        length = struct.pack("<I", len(body))
        out += MAGIC + length + struct.pack("<I", zlib.crc32(body, zlib.crc32(length))) + body
    return out


def _seqs(data: bytes) -> list[object]:
    """The first record's header of each frame: {"t": "Seq", "n": N} in the current format (an open log's zeros
    written ahead of its end are not frames)."""
    out, pos = [], 0
    while pos < len(data) and data[pos:pos + 4] == MAGIC:
        _, length, _ = struct.unpack_from("<4sII", data, pos)
        (header_len,) = struct.unpack_from("<I", data, pos + 16)
        out.append(json.loads(data[pos + 20:pos + 20 + header_len]))
        pos += 12 + length
    return out


def test_a_log_without_sequence_numbers_is_replayed_and_rewritten_numbered(tmp_path: Path) -> None:
    want = State()
    for m in _mutations():
        want.apply(m)
    old = _unsequenced_log(_mutations())
    (tmp_path / LOG_NAME).write_bytes(old)
    store = EmbeddedStore(tmp_path)
    state = store.load()
    assert fingerprint(state) == fingerprint(want)
    assert (tmp_path / f"{LOG_NAME}.unsequenced-0").read_bytes() == old
    store.commit([Issue("g1", 1, 2, 1e9, "r")], state)
    state.apply(Issue("g1", 1, 2, 1e9, "r"))
    assert _seqs((tmp_path / LOG_NAME).read_bytes()) == [{"t": "Seq", "n": 0}, {"t": "Seq", "n": 1}]
    store.compact(state)                                         # compaction writes the current format too
    store.commit([Issue("g2", 2, 2, 1e9, "r")], state)
    state.apply(Issue("g2", 2, 2, 1e9, "r"))
    store.close()
    assert _seqs((tmp_path / LOG_NAME).read_bytes()) == [{"t": "Seq", "n": 0}, {"t": "Seq", "n": 1}]
    assert fingerprint(EmbeddedStore(tmp_path).load()) == fingerprint(state)
