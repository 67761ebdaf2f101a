"""Work only rank 0 does while the other trainer ranks wait for it (the next batch from the buffer, an evaluation),
without a collective that lasts as long as the work.

The ranks' collectives fail after `trainer.collective_timeout_s` (torch.distributed's process group timeout), so a
rank that sits in a broadcast while rank 0 waits minutes for rollout to fill a batch would be failed. Instead rank 0
runs the work on a helper thread and, every `heartbeat` seconds until it is done, broadcasts one int: WAITING, READY
or FAILED; the other ranks loop on that broadcast. Each collective then lasts about a heartbeat, however long the
work takes, and a failure of rank 0's work ends every rank at once instead of after the timeout.

The work must not itself run collectives (it runs beside rank 0's heartbeat broadcasts).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")

WAITING, READY, FAILED = 0, 1, 2


class LeaderFailed(RuntimeError):
    """Rank 0's work failed (rank 0 raises the error itself; the other ranks raise this)."""


def heartbeat_seconds(collective_timeout_s: float) -> float:
    """How often rank 0 tells the others it is still working: well inside the collective timeout."""
    return max(min(10.0, collective_timeout_s / 10), 0.01)


def _say(flag: int, device: torch.device) -> int:
    t = torch.tensor([flag], dtype=torch.int64, device=device)
    dist.broadcast(t, src=0)
    return int(t.item())


def leader_work(work: Callable[[], T] | None, device: torch.device, heartbeat: float, what: str = "work") -> T | None:
    """Rank 0 passes `work` and gets its result; the other ranks pass None and return None once rank 0 is done
    (LeaderFailed when its work raised). Without a process group of several ranks: work() (or None)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return work() if work is not None else None
    if dist.get_rank() != 0:
        while True:
            flag = _say(WAITING, device)
            if flag == READY:
                return None
            if flag == FAILED:
                raise LeaderFailed(f"rank 0's {what} failed (its log has the reason)")
    if work is None:
        raise ValueError("rank 0 must pass the work")
    with ThreadPoolExecutor(1, thread_name_prefix=f"rank0-{what}") as pool:
        future = pool.submit(work)
        while True:
            try:
                result = future.result(timeout=heartbeat)
            except FutureTimeout:
                _say(WAITING, device)
                continue
            except Exception:
                _say(FAILED, device)
                raise
            _say(READY, device)
            return result
