"""Trainer backends: the `TrainerBackend` contract (contract.py) and the registry `BACKENDS` that trainer.backend
names one of. fsdp.py: FSDP2 over torch.distributed; megatron/: Megatron-core (imported only when built)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import torch

from rlfleet.config import Config, megatron_data_parallel_size
from rlfleet.services.trainer.backends.contract import BackendSpec, TrainerBackend


def _make_fsdp(cfg: Config, rank: int, world_size: int, device: torch.device,
               hooks: Sequence[object]) -> TrainerBackend:
    from rlfleet.services.trainer.backends.fsdp import FsdpBackend

    return FsdpBackend(cfg, rank, world_size, device, hooks)


def _make_megatron(cfg: Config, rank: int, world_size: int, device: torch.device,
                   hooks: Sequence[object]) -> TrainerBackend:
    from rlfleet.services.trainer.backends.megatron.backend import MegatronBackend

    return MegatronBackend(cfg, rank, world_size, device, hooks)


def _megatron_data_parallel(cfg: Config, world_size: int) -> int:
    return megatron_data_parallel_size(cfg.trainer, world_size)


def _release_megatron() -> None:
    from rlfleet.services.trainer.backends.megatron.release import release_parallel_state

    release_parallel_state()


BACKENDS: Mapping[str, BackendSpec] = MappingProxyType({
    "fsdp": BackendSpec("fsdp", _make_fsdp, lambda cfg, world_size: world_size),
    "megatron": BackendSpec("megatron", _make_megatron, _megatron_data_parallel, _release_megatron),
})


def backend_spec(name: str) -> BackendSpec:
    found = BACKENDS.get(name)
    if found is None:
        raise ValueError(f"unknown trainer.backend '{name}' (available: {', '.join(BACKENDS)})")
    return found


def make_backend(cfg: Config, rank: int, world_size: int, device: torch.device,
                 hooks: Sequence[object] = ()) -> TrainerBackend:
    """The backend of cfg.trainer.backend for this rank (collective: every rank calls it)."""
    return backend_spec(cfg.trainer.backend).make(cfg, rank, world_size, device, hooks)


def data_parallel_size(cfg: Config, world_size: int) -> int:
    """How many distinct slices a batch is split into: the data-parallel ranks."""
    return backend_spec(cfg.trainer.backend).data_parallel_size(cfg, world_size)


__all__ = ["BACKENDS", "BackendSpec", "TrainerBackend", "backend_spec", "data_parallel_size", "make_backend"]
