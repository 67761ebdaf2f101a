"""The contract of a trainer backend (trainer.backend), and the frozen description the registry holds for each.

A backend is one trainer rank's model and optimizer. Construct it on every rank after the process group is up;
every method documented "collective" is called by all ranks together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from rlfleet.config import Config
from rlfleet.sample import Sample
from rlfleet.services.trainer.checkpoint import CheckpointInfo
from rlfleet.services.trainer.step import StepContext
from rlfleet.services.weight_sync.transports.sharded import ShardedState


class TrainerBackend(Protocol):
    pad_id: int          # the model's pad token id (batches are padded with it)
    data_rank: int       # which slice of each batch this rank trains on (rank_groups)
    data_world: int      # how many slices a batch is split into (the data-parallel ranks)

    def train_step(self, groups: Sequence[Sequence[Sample]], step: int, ctx: StepContext) -> dict[str, float]:
        """Collective. One optimizer step on this rank's groups; returns the step's metrics (same on every rank)."""
        ...

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective. Rank 0 gets every tensor under its HF name (CPU, publish dtype); other ranks get {}."""
        ...

    def publish_state(self) -> dict[str, torch.Tensor] | ShardedState:
        """Collective. What a weight publish sends: a ShardedState (every rank iterates it while rank 0's sender
        stages it, so no rank holds the whole model) or, on rank 0, the full state dict."""
        ...

    def publish_options(self) -> dict[str, str]:
        """More manifest options of a publish (e.g. the tied aliases left out because their source is sent)."""
        ...

    @property
    def adapter_options(self) -> dict[str, str] | None:
        """LoRA: the manifest options of an adapter-only publish (None: full weights)."""
        ...

    def save_checkpoint(self, run_dir: Path, step: int, version: int, keep: int) -> Path:
        """Collective. Checkpoint model, optimizer, schedule and RNG; returns the checkpoint folder."""
        ...

    def load_checkpoint(self, info: CheckpointInfo) -> None:
        """Collective. Restore what save_checkpoint wrote (resharding to this world size where it can)."""
        ...


# (cfg, rank, world_size, device, hooks) -> the backend of this rank; hooks implement any subset of TrainerHooks
BackendFactory = Callable[[Config, int, int, torch.device, Sequence[object]], TrainerBackend]


@dataclass(frozen=True)
class BackendSpec:
    name: str                                   # trainer.backend
    make: BackendFactory
    data_parallel_size: Callable[[Config, int], int]   # (cfg, world_size) -> data-parallel ranks
    release: Callable[[], None] = lambda: None  # drops what the backend's library still holds of the process groups
