"""Disk-delta files: zstd-compressed safetensors plus a JSON index per version, written atomically.

    ROOT/v00000003/data.safetensors.zst   base (full tensors) or delta parts ("<name>::xor", "<name>::idx", ...)
    ROOT/v00000003/index.json             version, base_version, prev_version, kind, encoding, file size and xxh64,
                                          and for every tensor: dtype, shape, xxh64 of its *final* state

Each file goes to a temporary name, is fsynced and renamed; the index is written last, so a version exists only
once it is complete. A reader checks the file's xxh64 before decompressing and every tensor's final xxh64 after.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash
import zstandard
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

DATA = "data.safetensors.zst"
INDEX = "index.json"
ZSTD_LEVEL = 3


def version_dir(root: Path, version: int) -> Path:
    return Path(root) / f"v{version:08d}"


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Index:
    version: int
    base_version: int
    prev_version: int           # the version this delta applies to (== version for a base)
    kind: str                   # "base" | "delta"
    encoding: str               # "" for a base
    file_bytes: int
    file_xxh64: str
    raw_bytes: int              # safetensors bytes before compression
    tensors: dict[str, dict]    # name -> {"dtype", "shape", "xxh64"} of the final state, in manifest order

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=1)


def write_version(root: Path, index_fields: dict, parts: dict[str, torch.Tensor]) -> Index:
    """Compress `parts` into DATA, then write the index (the commit point). Returns the index."""
    d = version_dir(root, index_fields["version"])
    d.mkdir(parents=True, exist_ok=True)
    raw = st_save({k: v.contiguous() for k, v in parts.items()}) if parts else st_save({})
    data = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(raw)
    _write_atomic(d / DATA, data)
    index = Index(file_bytes=len(data), file_xxh64=xxhash.xxh64(data).hexdigest(), raw_bytes=len(raw),
                  **index_fields)
    _write_atomic(d / INDEX, index.to_json().encode())
    return index


def read_index(root: Path, version: int) -> Index:
    path = version_dir(root, version) / INDEX
    try:
        return Index(**json.loads(path.read_text()))
    except FileNotFoundError:
        raise FileNotFoundError(f"no index for version {version} at {path}") from None
    except (ValueError, TypeError) as exc:
        raise ValueError(f"unreadable delta index {path}: {exc}") from None


def read_parts(root: Path, index: Index) -> dict[str, torch.Tensor]:
    """The version's tensors/parts after checking the compressed file's size and xxh64."""
    path = version_dir(root, index.version) / DATA
    data = path.read_bytes()
    if len(data) != index.file_bytes or xxhash.xxh64(data).hexdigest() != index.file_xxh64:
        raise ValueError(f"{path}: checksum mismatch ({len(data)} bytes, xxh64 {xxhash.xxh64(data).hexdigest()}; "
                         f"index says {index.file_bytes} bytes, {index.file_xxh64}): file corrupted")
    raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=index.raw_bytes)
    return st_load(raw)
