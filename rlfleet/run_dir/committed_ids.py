"""The sample ids each checkpoint committed, read without torch (the buffer reads them back on start).

A checkpoint folder RUN_DIR/checkpoints/step_NNNNNNNN holds committed_ids_rankNNNNN.json per rank: the sample ids
(`group_id/index`) that rank trained on in the steps this checkpoint committed (since the previous checkpoint).
Only complete checkpoints count: meta.json present and every file checksums.json lists there with its size.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def committed_ids_name(rank: int) -> str:
    return f"committed_ids_rank{rank:05d}.json"


def complete_meta(path: Path) -> dict[str, Any] | None:
    """meta.json of a checkpoint folder whose every file has the size its checksums.json records; None otherwise
    (a folder still being written, or cut short). The trainer's checkpoint listing reads folders through this too."""
    try:
        meta = json.loads((path / "meta.json").read_text())
        sums = json.loads((path / "checksums.json").read_text())
    except (OSError, ValueError):
        return None
    for rel, entry in sums.items():
        f = path / rel
        if not f.is_file() or f.stat().st_size != entry["bytes"]:
            return None
    return meta if isinstance(meta, dict) else None


def complete_step(path: Path) -> int | None:
    """The step of a complete checkpoint folder (complete_meta); None otherwise."""
    meta = complete_meta(path)
    return None if meta is None else int(meta["step"])


def committed_after(run_dir: Path, step: int) -> dict[str, int]:
    """sample id -> the step of the checkpoint that committed it, over complete checkpoints newer than `step`."""
    out: dict[str, int] = {}
    root = Path(run_dir) / "checkpoints"
    for path in sorted(root.glob("step_*")) if root.is_dir() else []:
        ckpt_step = complete_step(path)
        if ckpt_step is None or ckpt_step <= step:
            continue
        for f in sorted(path.glob("committed_ids_rank*.json")):
            for sample_id in json.loads(f.read_text()):
                out[str(sample_id)] = ckpt_step
    return out
