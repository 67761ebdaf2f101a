"""An append-only file of checksummed frames: [b"RLFC"][u32 length][u32 crc32 of length+body][body].

A frame is one commit (rlfleet.services.buffer.stores.embedded), so replay applies a commit whole or not at all. Reading
tells a torn tail from corruption: a bad frame followed by an intact one is corruption; a bad last frame is a torn
tail (cut off) only when it looks like a write that did not finish, else it too is corruption
(rlfleet.services.buffer.stores.tail_check); scan() reports corruption (file, offset, what follows) instead of
cutting acknowledged commits away.

A log written before frames had the magic (one mutation per [u32 length][u32 crc32][body] frame, no commit
boundaries) is read by scan_legacy, but only a file whose first frame positively parses as one (a log of the
current format whose magic took a flipped bit is not mistaken for it); the embedded store rewrites it in the current
format on load, keeping the original beside it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rlfleet.run_dir.atomic import fsync_dir
from rlfleet.services.buffer.stores.tail_check import MAGIC, classify_tail

_LEN = struct.Struct("<I")
_HEAD = struct.Struct("<4sII")          # magic, body length, crc32(length bytes + body)
_LEGACY = struct.Struct("<II")          # length, crc32(body)
HEADER_BYTES = _HEAD.size
_ZEROS = memoryview(bytes(1 << 20))     # what AppendLog writes ahead of the log, a slice at a time
log = logging.getLogger(__name__)


def _crc(parts: list[bytes] | tuple[bytes, ...]) -> tuple[int, int]:
    length = sum(len(p) for p in parts)
    crc = zlib.crc32(_LEN.pack(length))
    for part in parts:
        crc = zlib.crc32(part, crc)
    return length, crc


def frame_parts(parts: list[bytes]) -> list[bytes]:
    """The frame of the body b"".join(parts), as buffers to write in order: the body is never concatenated."""
    length, crc = _crc(parts)
    return [_HEAD.pack(MAGIC, length, crc), *parts]


def frame(body: bytes) -> bytes:
    return b"".join(frame_parts([body]))


def iter_frames(bodies: list[bytes]) -> Iterator[bytes]:
    for body in bodies:
        yield frame(body)


def _frame_at(data: bytes | memoryview, pos: int) -> tuple[int, str]:
    """(end offset, "") of the intact frame at pos, or (pos, why it is not one)."""
    if len(data) - pos < _HEAD.size:
        return pos, f"{len(data) - pos} bytes, shorter than a frame header"
    magic, length, crc = _HEAD.unpack_from(data, pos)
    if magic != MAGIC:
        return pos, "no frame magic"
    end = pos + _HEAD.size + length
    if end > len(data):
        return pos, f"frame of {length} bytes runs past the end of the file"
    if zlib.crc32(data[pos + _HEAD.size:end], zlib.crc32(_LEN.pack(length))) != crc:
        return pos, "checksum mismatch"
    return end, ""


def body_at(data: bytes, pos: int) -> bytes:
    """The body of the (intact) frame at pos."""
    _, length, _ = _HEAD.unpack_from(data, pos)
    return data[pos + _HEAD.size:pos + _HEAD.size + length]


@dataclass(frozen=True)
class Damage:
    offset: int                        # where the first bad frame starts
    reason: str
    intact_after: tuple[int, ...]      # offsets of intact frames after it
    corrupt_tail: bool = False         # no intact frame after it, yet not what a torn write leaves

    @property
    def torn_tail(self) -> bool:
        """A write that did not finish (never acknowledged): cut at the next start. Anything else is refused."""
        return not self.intact_after and not self.corrupt_tail


@dataclass
class Scan:
    """What a log holds: intact frames in order (offset, body) and where the intact prefix ends."""

    path: Path
    size: int
    frames: list[tuple[int, bytes]] = field(default_factory=list)
    end: int = 0                       # offset after the last frame of the intact prefix
    damage: Damage | None = None
    legacy: bool = False

    def describe(self) -> str:
        if self.damage is None:
            return f"{self.path}: {len(self.frames)} commits, {self.size} bytes, intact"
        d = self.damage
        if d.torn_tail:
            return (f"{self.path}: {len(self.frames)} commits intact; torn tail of {self.size - d.offset} bytes at "
                    f"offset {d.offset} ({d.reason})")
        if not d.intact_after:
            return (f"{self.path}: corrupt last frame at offset {d.offset} ({d.reason}): it may be an acknowledged "
                    f"commit; {len(self.frames)} commits before it are intact")
        return (f"{self.path}: corrupt frame at offset {d.offset} ({d.reason}) followed by "
                f"{len(d.intact_after)} intact frames (first at offset {d.intact_after[0]}); {len(self.frames)} "
                f"commits before it are intact")


def scan_bytes(path: Path, data: bytes) -> Scan:
    """Every intact frame of data, and the first damage: a torn tail or a corrupt frame with intact ones after it."""
    if is_legacy(data):
        return scan_legacy(path, data)
    out = Scan(Path(path), len(data))
    view, pos = memoryview(data), 0
    while pos < len(data):
        end, why = _frame_at(view, pos)
        if why:
            after = tuple(intact_frames_after(view, pos))
            corrupt = False
            if not after:
                why, corrupt = classify_tail(view, pos)
            out.damage = Damage(pos, why, after, corrupt)
            break
        out.frames.append((pos, bytes(view[pos + _HEAD.size:end])))
        pos = end
    out.end = pos
    return out


def intact_frames_after(data: bytes | memoryview, pos: int) -> Iterator[int]:
    """Offsets of the intact frames that start after pos (each found by its magic, checked by its checksum)."""
    raw = bytes(data) if isinstance(data, memoryview) else data
    at = raw.find(MAGIC, pos + 1)
    while at != -1:
        end, why = _frame_at(data, at)
        if not why:
            yield at
            at = raw.find(MAGIC, end)
        else:
            at = raw.find(MAGIC, at + 1)


def scan(path: Path) -> Scan:
    path = Path(path)
    return scan_bytes(path, path.read_bytes() if path.exists() else b"")


def is_legacy(data: bytes) -> bool:
    """A log of the format before commit frames: no magic, and its first frame is intact with a non-empty body
    (zeros, or a current log whose magic took a flipped bit, are not)."""
    if len(data) < _LEGACY.size or data[:4] == MAGIC:
        return False
    length, crc = _LEGACY.unpack_from(data)
    body = data[_LEGACY.size:_LEGACY.size + length]
    return 0 < length == len(body) and zlib.crc32(body) == crc


def scan_legacy(path: Path, data: bytes) -> Scan:
    """A log of the format before commit frames: each intact frame's body is one mutation. A bad frame ends it
    (that format cannot tell a torn tail from corruption; nothing after it is trusted): a torn tail when it runs
    past the end of the file or only zeros follow, else refused as corruption."""
    out, pos = Scan(Path(path), len(data), legacy=True), 0
    while pos + _LEGACY.size <= len(data):
        length, crc = _LEGACY.unpack_from(data, pos)
        body = data[pos + _LEGACY.size:pos + _LEGACY.size + length]
        if len(body) < length or zlib.crc32(body) != crc:
            break
        out.frames.append((pos, body))
        pos += _LEGACY.size + length
    out.end = pos
    if pos < len(data):
        rest = len(data) - pos
        torn = data.count(0, pos) == rest or rest < _LEGACY.size or pos + _LEGACY.size + _LEGACY.unpack_from(
            data, pos)[0] > len(data)
        out.damage = Damage(pos, "bad frame in a log of the old format" + (
            " (an append that did not finish)" if torn else "; what follows cannot be told apart"), (), not torn)
    return out


_IOV_MAX = 512   # buffers per writev call (POSIX guarantees at least 16; Linux allows 1024)


def _writev_all(fd: int, buffers: list[bytes]) -> int:
    """Write every buffer in order, resuming after short writes; returns the bytes written."""
    views = [memoryview(b) for b in buffers if len(b)]
    done, i = 0, 0
    while i < len(views):
        n = os.writev(fd, views[i:i + _IOV_MAX])
        done += n
        while i < len(views) and n >= len(views[i]):
            n -= len(views[i])
            i += 1
        if n:
            views[i] = views[i][n:]
    return done


class AppendLog:
    """Appends framed records with one write per batch; fsync is the caller's policy. Holds an exclusive flock on
    the file (one writer; the OS frees it if the process dies).

    `preallocate` > 0 keeps up to that many zero bytes written past the log's end (refilled when half is used): an
    append inside them does not grow the file, so the fsync after it has no file size to journal, only data
    (measured on ext4: 0.19 -> 0.12 ms an fsync of a 9 KB append, 0.6 -> 0.3 ms of a 530 KB one). The zeros are a
    torn tail to scan(), so a crash leaves nothing a reader mistakes for a commit; close() cuts them off."""

    def __init__(self, path: Path, valid_size: int, truncate: bool = True, preallocate: int = 0) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise RuntimeError(f"{path} is in use by another buffer process") from None
        if truncate:
            os.ftruncate(self._fd, valid_size)
        os.lseek(self._fd, valid_size, os.SEEK_SET)
        self.size = valid_size           # the log: where the next frame goes
        self.file_size = os.fstat(self._fd).st_size if not truncate else valid_size   # with the zeros after it
        self.preallocate = preallocate
        self._zero_fill_failed = False

    def append(self, bodies: list[bytes]) -> None:
        self.append_buffers(list(iter_frames(bodies)))

    def append_buffers(self, buffers: list[bytes]) -> None:
        """Write already-framed records with as few syscalls as the OS allows (writev); all or nothing."""
        total = sum(len(b) for b in buffers)
        if self.preallocate and self.file_size - self.size - total < self.preallocate // 2:
            self._zero_fill(self.size + total + self.preallocate)
        try:
            written = _writev_all(self._fd, buffers)
        except OSError:
            self._cut()                       # leave no half record behind a later good one
            raise
        assert written == total
        self.size += total
        self.file_size = max(self.file_size, self.size)

    def _zero_fill(self, end: int) -> None:
        """Write zeros from the file's end to `end` (not fsynced here: the next commit's fsync carries them, once).
        On a full disk it stops where the disk did: appends then grow the file as they would without it."""
        start = self.file_size
        try:
            while start < end:
                start += os.pwrite(self._fd, _ZEROS[:min(end - start, len(_ZEROS))], start)
        except OSError as exc:
            if not self._zero_fill_failed:
                log.warning("%s: cannot write zeros ahead of the log (%s); commits go on into the %d bytes left",
                            self.path, exc, start - self.size)
            self._zero_fill_failed = True
        else:
            self._zero_fill_failed = False
        self.file_size = start

    def reserve(self, end: int) -> None:
        """Write zeros from the file's end to `end`, raising OSError when the disk cannot take them (what is written
        stays: zeros ahead of the log, where later appends go without growing the file)."""
        start = self.file_size
        try:
            while start < end:
                start += os.pwrite(self._fd, _ZEROS[:min(end - start, len(_ZEROS))], start)
        finally:
            self.file_size = max(self.file_size, start)

    def _cut(self) -> None:
        os.ftruncate(self._fd, self.size)
        os.lseek(self._fd, self.size, os.SEEK_SET)
        self.file_size = self.size

    def fsync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        """Cut the unused zeros off (a clean log at rest ends at its last frame), then close."""
        try:
            if self.file_size > self.size:
                os.ftruncate(self._fd, self.size)
        except OSError:
            pass                               # the zeros stay: a torn tail, cut at the next start
        finally:
            os.close(self._fd)


def replace_with(path: Path, buffers: list[bytes], preallocate: int = 0) -> AppendLog:
    """Write buffers as a new file, fsync it and rename it over path; returns it open for appending (locked before
    the rename, so no second writer can take the new file). On any error path is untouched and the temporary file
    is removed."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    log: AppendLog | None = None
    try:
        if tmp.exists():
            tmp.unlink()
        log = AppendLog(tmp, 0)
        log.append_buffers(buffers)
        log.preallocate = preallocate
        log.fsync()
        os.replace(tmp, path)
    except BaseException:
        if log is not None:                 # ours: remove it
            log.close()
            tmp.unlink(missing_ok=True)
        raise
    log.path = path
    try:
        fsync_dir(path.parent)      # the rename is done: the new file serves even if its name is not yet durable
    except OSError:
        pass
    return log


def read_records(path: Path) -> tuple[list[bytes], int]:
    """The bodies of the intact frames of the log's intact prefix, and the offset where that prefix ends."""
    result = scan(path)
    return [body for _, body in result.frames], result.end
