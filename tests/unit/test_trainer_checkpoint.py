"""Checkpoint folders: `latest` ignores incomplete ones, checksums catch corruption, old ones are pruned;
trainer config checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlfleet.config import Config, ConfigError, parse_config
from rlfleet.services.trainer import checkpoint
from rlfleet.services.trainer.service import validate


def _fake_checkpoint(run_dir: Path, step: int, complete: bool = True) -> Path:
    path = checkpoint.step_dir(run_dir, step)
    (path / "state").mkdir(parents=True)
    (path / "state" / "__0_0.distcp").write_bytes(b"x" * (step + 10))
    (path / "meta.json").write_text(json.dumps({"step": step, "version": step // 2, "world_size": 1}))
    if complete:
        sums = {rel: {"xxh64": checkpoint._file_hash(path / rel), "bytes": (path / rel).stat().st_size}
                for rel in ("state/__0_0.distcp", "meta.json")}
        (path / checkpoint.CHECKSUMS).write_text(json.dumps(sums))
    return path


def test_latest_ignores_incomplete_and_temp_folders(tmp_path: Path) -> None:
    assert checkpoint.latest(tmp_path) is None
    _fake_checkpoint(tmp_path, 3)
    _fake_checkpoint(tmp_path, 9, complete=False)                  # no checksums: the writer died
    truncated = _fake_checkpoint(tmp_path, 7)
    (truncated / "state" / "__0_0.distcp").write_bytes(b"x")       # a file shorter than recorded
    checkpoints_tmp = tmp_path / "checkpoints" / ".tmp-step_00000011"
    checkpoints_tmp.mkdir()
    info = checkpoint.latest(tmp_path)
    assert info is not None and (info.step, info.version, info.world_size) == (3, 1, 1)
    assert checkpoints_tmp.exists()
    checkpoint.prune(tmp_path, keep=1)
    assert not checkpoints_tmp.exists() and checkpoint.latest(tmp_path) == info


def test_verify_catches_a_flipped_byte_and_prune_keeps_the_newest(tmp_path: Path) -> None:
    paths = [_fake_checkpoint(tmp_path, s) for s in (1, 2, 4)]
    checkpoint.verify(paths[2])
    (paths[2] / "state" / "__0_0.distcp").write_bytes(b"y" * 14)
    with pytest.raises(checkpoint.CheckpointError, match="checksum"):
        checkpoint.verify(paths[2])
    checkpoint.prune(tmp_path, keep=2)
    assert [p.exists() for p in paths] == [False, True, True]


def _cfg(**trainer: object) -> Config:
    return parse_config({"model": {"path": "m"}, "rollout": {"data_source": "a:b", "reward_fn": "a:b"},
                         "trainer": trainer,
                         "endpoints": {"buffer": "h:1", "weight_sync": "h:2", "trainer": "h:3",
                                       "trainer_data": "h:4"}})


def test_groups_must_split_over_ranks_and_minibatches() -> None:
    validate(_cfg(world_size=2, groups_per_step=8, minibatches=2), 2)
    with pytest.raises(ConfigError, match="divisible by data-parallel ranks"):
        validate(_cfg(world_size=2, groups_per_step=3), 2)
    with pytest.raises(ConfigError, match="divisible by data-parallel ranks"):
        validate(_cfg(world_size=2, groups_per_step=4, minibatches=4), 2)
    with pytest.raises(ConfigError, match="WORLD_SIZE"):
        validate(_cfg(world_size=2, groups_per_step=4), 1)
