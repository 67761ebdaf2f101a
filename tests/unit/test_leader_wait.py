"""Rank 0 may wait for a batch far longer than the ranks' collective timeout (trainer.collective_timeout_s) while the
other ranks wait for it in heartbeat broadcasts (rlfleet/services/trainer/leader_wait.py), and a failure of that wait
ends every rank at once. Two real gloo ranks over loopback with a 2 s collective timeout; the control shows that
timeout is real: a plain broadcast that waits out the same 5 s is failed by torch."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlfleet.runtime.ports import free_ports
from rlfleet.services.trainer.backends.fsdp import init_distributed
from rlfleet.services.trainer.collectives import broadcast_bytes
from rlfleet.services.trainer.leader_wait import LeaderFailed, heartbeat_seconds, leader_work
from tests.support.ranks import spawn_ranks

TIMEOUT_S = 2.0
SLOW_S = 5.0                      # rank 0's wait: longer than the collective timeout
CPU = torch.device("cpu")


def _slow_batch() -> bytes:
    time.sleep(SLOW_S)
    return b"the batch"


def _broken() -> bytes:
    raise RuntimeError("the buffer is gone")


def _worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    init_distributed(f"127.0.0.1:{port}", rank, world, CPU, timedelta(seconds=TIMEOUT_S))
    beat = heartbeat_seconds(TIMEOUT_S)
    seen: dict[str, str] = {}
    # 1. a wait longer than the timeout, then the batch itself
    leader_work(_slow_batch if rank == 0 else None, CPU, beat, "batch")
    seen["batch"] = broadcast_bytes(b"the batch" if rank == 0 else None, CPU).decode()
    # 2. rank 0's work fails: every rank learns it at once
    try:
        leader_work(_broken if rank == 0 else None, CPU, beat, "batch")
        seen["failure"] = "none"
    except LeaderFailed:
        seen["failure"] = "LeaderFailed"
    except RuntimeError as exc:
        seen["failure"] = str(exc)
    # 3. control: the same wait in one plain broadcast exceeds the collective timeout
    try:
        if rank == 0:
            time.sleep(SLOW_S)
        t = torch.zeros(1)
        dist.broadcast(t, src=0)
        seen["plain"] = "completed"
    except Exception as exc:  # noqa: BLE001 - which error torch raises is its business
        seen["plain"] = type(exc).__name__
    Path(out, f"rank{rank}.json").write_text(json.dumps(seen))


@pytest.mark.timeout(300)
def test_rank_0_waits_past_the_collective_timeout_while_the_others_heartbeat(tmp_path: Path) -> None:
    spawn_ranks(_worker, (2, free_ports(1)[0], str(tmp_path)), 2)
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    rank1 = json.loads((tmp_path / "rank1.json").read_text())
    assert rank0["batch"] == rank1["batch"] == "the batch"
    assert rank0["failure"] == "the buffer is gone" and rank1["failure"] == "LeaderFailed"
    assert rank1["plain"] != "completed", "the 2 s collective timeout did not apply: the test proves nothing"


def test_heartbeat_stays_well_inside_the_timeout() -> None:
    assert heartbeat_seconds(1800) == 10.0
    assert heartbeat_seconds(2.0) == pytest.approx(0.2)
