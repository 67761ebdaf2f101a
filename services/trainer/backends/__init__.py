"""Trainer backends. trainer.backend names one; `make_backend` builds it (megatron-core is imported only for
"megatron"). A backend offers the trainer loop: pad_id, train_step(groups, step, ctx), full_state_dict() (HF names,
rank 0), and optionally sharded_state() (a ShardedState every rank iterates while rank 0 publishes: preferred over
full_state_dict for publishing when present), data_rank/data_world (which slice of a batch this rank trains on;
default: rank/world) and save_checkpoint/load_checkpoint (default: services/trainer/checkpoint.py on
backend.model/optimizer)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rlfleet.config import Config
from services.trainer import checkpoint


def make_backend(cfg: Config, rank: int, world_size: int, device: torch.device, hooks: Sequence[Any] = ()) -> Any:
    """The backend of cfg.trainer.backend for this rank (collective: every rank calls it)."""
    if cfg.trainer.backend == "megatron":
        from services.trainer.backends.megatron import MegatronBackend
        return MegatronBackend(cfg, rank, world_size, device, hooks)
    from services.trainer.backends.fsdp import FsdpBackend
    return FsdpBackend(cfg, rank, world_size, device, hooks)


def data_parallel_size(cfg: Config, world_size: int) -> int:
    """How many distinct slices a batch is split into: the data-parallel ranks."""
    if cfg.trainer.backend == "megatron":
        m = cfg.trainer.megatron
        return max(world_size // (m.tensor_parallel * m.pipeline_parallel), 1)
    return world_size


def data_shard(backend: Any, rank: int, world_size: int) -> tuple[int, int]:
    """(data-parallel rank, data-parallel size) of this rank: the slice of each batch it trains on."""
    return getattr(backend, "data_rank", rank), getattr(backend, "data_world", world_size)


def save_checkpoint(backend: Any, run_dir: Path, step: int, version: int, device: torch.device, keep: int) -> Path:
    """Collective: checkpoint the backend's model and optimizer; returns the checkpoint folder."""
    if hasattr(backend, "save_checkpoint"):
        return backend.save_checkpoint(run_dir, step, version, keep)
    return checkpoint.save(run_dir, step, version, backend.model, backend.optimizer, device, keep)


def load_checkpoint(backend: Any, info: checkpoint.CheckpointInfo, device: torch.device) -> None:
    """Collective: restore the backend's model, optimizer and RNG state from a checkpoint."""
    if hasattr(backend, "load_checkpoint"):
        backend.load_checkpoint(info)
        return
    checkpoint.load(info, backend.model, backend.optimizer, device)
