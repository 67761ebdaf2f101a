"""Is a bad last frame a write that did not finish, or a complete commit whose bytes were damaged afterwards?

A crash or power loss tears only a commit that was never fsynced, so never an acknowledged one; what it leaves of
that commit is a prefix of its frame, possibly followed by zeros (the space written ahead of the log, or blocks the
filesystem zero-filled): the frame runs past the end of the file, or holds zeros where its data should be, or its
head is a prefix of the magic followed by zeros. Such a tail is cut. Anything else with no intact frame after it
(the frame's bytes all there, not zero-filled, yet its checksum fails) is damage to bytes that had been written
whole, which may be an acknowledged commit: corruption, refused like a bad frame mid-log.

A single flipped bit anywhere in the frame (magic, length, checksum or body) is found outright: repairing it makes
the frame intact, so it is a damaged complete commit, unless the frame is zeros from that bit on (a write that
stopped there and was zero-filled explains it as well: cut). The body's
flip is located from the checksum's syndrome (CRC-32 is linear: flipping bit b of the byte d bytes before the end
of the body changes the checksum by a value that depends on b and d only), walking back one byte per step.
"""

from __future__ import annotations

import struct
import zlib

MAGIC = b"RLFC"
_LEN = struct.Struct("<I")
_HEAD = struct.Struct("<4sII")
SECTOR = 512                      # the smallest unit a disk writes (a torn write leaves whole sectors of zeros)
MAX_BODY_SEARCH = 64 << 20        # longer bodies are not searched for one flipped bit (about 20 s a 64 MB body)


def _zero_step(crc: int) -> int:
    """The linear part of zlib's CRC-32 register update for one zero byte."""
    return zlib.crc32(b"\0", crc) ^ zlib.crc32(b"\0", 0)


_STEP = [_zero_step(i) for i in range(256)]                  # the register update table T[i]
_BY_TOP = {t >> 24: i for i, t in enumerate(_STEP)}          # its top bytes are a permutation of 0..255
_ONE_BYTE = {zlib.crc32(bytes([1 << b])) ^ zlib.crc32(b"\0"): b for b in range(8)}   # syndromes at the last byte


def _unstep(crc: int) -> int:
    """The inverse of one zero-byte step: c' = T[c & 0xff] ^ (c >> 8)."""
    i = _BY_TOP[crc >> 24]
    return (((crc ^ _STEP[i]) << 8) & 0xFFFFFFFF) | i


def _intact(data: bytes | memoryview, pos: int, length: int, crc: int) -> bool:
    end = pos + _HEAD.size + length
    return end <= len(data) and zlib.crc32(data[pos + _HEAD.size:end], zlib.crc32(_LEN.pack(length))) == crc


def _one_bit_apart(a: int, b: int) -> bool:
    x = a ^ b
    return x != 0 and x & (x - 1) == 0


def flipped_bit(data: bytes | memoryview, pos: int) -> int | None:
    """The file offset of a single flipped bit whose repair makes the frame at pos intact, or None."""
    if len(data) - pos < _HEAD.size:
        return None
    magic, length, crc = _HEAD.unpack_from(data, pos)
    if magic != MAGIC:
        delta = int.from_bytes(magic, "little") ^ int.from_bytes(MAGIC, "little")
        if _one_bit_apart(delta, 0) and _intact(data, pos, length, crc):
            return pos + (delta.bit_length() - 1) // 8
        return None
    for bit in range(32):
        if _intact(data, pos, length ^ (1 << bit), crc):
            return pos + 4 + bit // 8
    end = pos + _HEAD.size + length
    if end > len(data):
        return None
    actual = zlib.crc32(data[pos + _HEAD.size:end], zlib.crc32(_LEN.pack(length)))
    if _one_bit_apart(actual, crc):
        return pos + 8 + ((actual ^ crc).bit_length() - 1) // 8
    if length > MAX_BODY_SEARCH:
        return None
    syndrome = actual ^ crc
    for back in range(length):                       # the flipped byte is `back` bytes before the body's end
        if syndrome in _ONE_BYTE:
            return end - 1 - back
        syndrome = _unstep(syndrome)
    return None


def _head_is_torn(head: bytes) -> bool:
    """A frame head a write could leave unfinished: a prefix of the magic, then zeros."""
    cut = len(head.rstrip(b"\0"))
    return head[:cut] == MAGIC[:cut]


def _zero_filled(data: bytes | memoryview, start: int, end: int) -> bool:
    """Whether data[start:end] ends in zeros or holds a whole zero sector: what a torn write leaves."""
    if end > start and data[end - 1] == 0:
        return True
    at = -(-start // SECTOR) * SECTOR
    zeros = bytes(SECTOR)
    while at + SECTOR <= end:
        if data[at:at + SECTOR] == zeros:
            return True
        at += SECTOR
    return False


def _zeros_from(data: bytes | memoryview, pos: int, at: int) -> bool:
    """Whether the frame at pos holds only zeros from offset `at` on: a bit whose repair sets it there is as well
    explained by a write that stopped at `at` and was zero-filled (the torn reading wins: it is cut)."""
    _, length, _ = _HEAD.unpack_from(data, pos)
    end = min(len(data), pos + _HEAD.size + length)
    return at < end and bytes(data[at:end]).count(0) == end - at


def classify_tail(data: bytes | memoryview, pos: int) -> tuple[str, bool]:
    """Why the bad frame at pos (no intact frame after it) is bad, and whether it is corruption (True: a complete
    commit damaged, refused) rather than a torn write (False: cut)."""
    rest = len(data) - pos
    if bytes(data[pos:]).count(0) == rest:
        return "zeros: space written ahead of the log, or a crash's zero fill", False
    at = flipped_bit(data, pos)
    if at is not None and not _zeros_from(data, pos, at):
        return f"a flipped bit at offset {at} in a complete commit", True
    if rest < _HEAD.size:
        return f"{rest} bytes, shorter than a frame header (an append that did not finish)", False
    magic, length, _ = _HEAD.unpack_from(data, pos)
    if magic != MAGIC:
        if _head_is_torn(bytes(data[pos:pos + _HEAD.size])):
            return "a frame head cut short and zero-filled (an append that did not finish)", False
        return "no frame magic where the next commit starts, and no zeros a torn write leaves", True
    end = pos + _HEAD.size + length
    if end > len(data):
        return f"frame of {length} bytes runs past the end of the file (an append that did not finish)", False
    if _zero_filled(data, pos, end):
        return "checksum mismatch over a zero-filled frame (an append that did not finish)", False
    return "checksum mismatch over a complete frame that no torn write leaves", True
