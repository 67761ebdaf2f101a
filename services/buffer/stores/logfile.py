"""An append-only file of checksummed records: [u32 length][u32 crc32][body]. A torn tail is cut off on open."""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

_HEAD = struct.Struct("<II")
log = logging.getLogger(__name__)


def frame(body: bytes) -> bytes:
    return _HEAD.pack(len(body), zlib.crc32(body)) + body


def frame_parts(parts: list[bytes]) -> list[bytes]:
    """The frame of the body b"".join(parts), as buffers to write in order: the body is never concatenated."""
    crc, length = 0, 0
    for part in parts:
        crc = zlib.crc32(part, crc)
        length += len(part)
    return [_HEAD.pack(length, crc), *parts]


def read_records(path: Path) -> tuple[list[bytes], int]:
    """Every intact record and the byte offset where the intact prefix ends."""
    data = path.read_bytes() if path.exists() else b""
    out, pos = [], 0
    while pos + _HEAD.size <= len(data):
        length, crc = _HEAD.unpack_from(data, pos)
        body = data[pos + _HEAD.size:pos + _HEAD.size + length]
        if len(body) < length or zlib.crc32(body) != crc:
            break
        out.append(body)
        pos += _HEAD.size + length
    if pos < len(data):
        log.warning("%s: %d bytes after offset %d are torn or corrupt; cut off", path, len(data) - pos, pos)
    return out, pos


def iter_frames(bodies: list[bytes]) -> Iterator[bytes]:
    for body in bodies:
        yield frame(body)


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
    """Appends framed records with one write per batch; fsync is the caller's policy."""

    def __init__(self, path: Path, valid_size: int) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # one writer; the OS frees it if we die
        except BlockingIOError:
            os.close(self._fd)
            raise RuntimeError(f"{path} is in use by another buffer process") from None
        os.ftruncate(self._fd, valid_size)
        os.lseek(self._fd, valid_size, os.SEEK_SET)
        self.size = valid_size

    def append(self, bodies: list[bytes]) -> None:
        self.append_buffers(list(iter_frames(bodies)))

    def append_buffers(self, buffers: list[bytes]) -> None:
        """Write already-framed records with as few syscalls as the OS allows (writev); all or nothing."""
        total = sum(len(b) for b in buffers)
        try:
            written = _writev_all(self._fd, buffers)
        except OSError:
            os.ftruncate(self._fd, self.size)   # leave no half record behind a later good one
            os.lseek(self._fd, self.size, os.SEEK_SET)
            raise
        assert written == total
        self.size += total

    def fsync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)
