"""Read an offline W&B run file (RUN/wandb/offline-run-*/run-*.wandb) back as wandb's own protobuf Records.

wandb 0.31 has no Python reader any more (its Go core writes the file), so the framing is read here: a 7-byte header
(':W&B', magic 0xBEE1, version 0), then LevelDB-log records in 32 KiB blocks, each chunk `crc32 (4) | length (2 LE) |
type (1: full, 2: first, 3: middle, 4: last)`. Each whole record is parsed with wandb.proto.wandb_internal_pb2.Record.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7


def read_records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B run file")
    pos, pending, out = HEADER, b"", []
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:                       # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def history(path: Path) -> list[dict[str, str]]:
    """Each logged row: key -> value_json (with '_step')."""
    rows = []
    for record in read_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): item.value_json for item in record.history.item})
    return rows
