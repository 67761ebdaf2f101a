"""Packed little-endian arrays: how token ids and floats travel inside protobuf messages."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_I32 = np.dtype("<i4")
_F32 = np.dtype("<f4")
_U8 = np.dtype("u1")


def pack_i32(values: Sequence[int] | np.ndarray) -> bytes:
    return np.asarray(values, dtype=_I32).tobytes()


def unpack_i32(data: bytes) -> np.ndarray:
    if len(data) % 4:
        raise ValueError(f"int32 array has {len(data)} bytes, not a multiple of 4")
    return np.frombuffer(data, dtype=_I32)


def pack_f32(values: Sequence[float] | np.ndarray) -> bytes:
    return np.asarray(values, dtype=_F32).tobytes()


def unpack_f32(data: bytes) -> np.ndarray:
    if len(data) % 4:
        raise ValueError(f"float32 array has {len(data)} bytes, not a multiple of 4")
    return np.frombuffer(data, dtype=_F32)


def pack_u8(values: Sequence[int] | np.ndarray) -> bytes:
    return np.asarray(values, dtype=_U8).tobytes()


def unpack_u8(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=_U8)
