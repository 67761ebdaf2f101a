"""Trainer ranks in spawned processes that leave torch.distributed before their interpreter ends.

A rank body builds its model and trains in its own frame; once it has returned, nothing holds the model, and
`leave_distributed` ends the process group and its threads while the interpreter is whole (see
rlfleet/services/trainer/distributed_exit.py: left to the interpreter's teardown, they aborted a rank now and then).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

from rlfleet.services.trainer.distributed_exit import leave_distributed


def rank_main(body: Callable[..., None], *args: Any) -> None:
    """Run body(*args), then leave the process group (also after a failure): a multiprocessing Process target."""
    try:
        body(*args)
    finally:
        leave_distributed()


def _spawned(rank: int, body: Callable[..., None], *args: Any) -> None:
    rank_main(body, rank, *args)


def spawn_ranks(body: Callable[..., None], args: tuple[Any, ...], nprocs: int) -> None:
    """mp.spawn(body, args, nprocs) whose ranks leave the group after body returns; raises when a rank fails."""
    mp.spawn(_spawned, args=(body, *args), nprocs=nprocs, join=True)
