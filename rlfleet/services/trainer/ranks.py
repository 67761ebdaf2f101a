"""Where each trainer rank runs: pods x ranks per pod -> global rank, local rank (its device) and world size.

A GPU trainer pod with N GPUs runs N ranks, one per GPU (LOCAL_RANK picks `cuda:LOCAL_RANK`); a CPU pod usually
runs one. Ranks are numbered pod by pod, so the ranks of one pod are contiguous (what NCCL's intra-node rings want),
and global rank 0 is local rank 0 of pod 0: the rank that serves rlfleet.v1.Trainer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


class RankLayoutError(ValueError):
    """The pod index, pod count or ranks per pod cannot describe a trainer gang."""


@dataclass(frozen=True)
class RankPlacement:
    rank: int            # global rank in the trainer's process group
    local_rank: int      # index within its pod: the device it drives
    world_size: int      # pods * ranks_per_pod
    pod_index: int
    local_world_size: int  # ranks in this pod


def pod_ranks(pod_index: int, pods: int, ranks_per_pod: int) -> list[RankPlacement]:
    """The ranks that pod `pod_index` of `pods` runs, `ranks_per_pod` each."""
    if pods < 1 or ranks_per_pod < 1:
        raise RankLayoutError(f"pods={pods} and ranks per pod={ranks_per_pod} must both be >= 1")
    if not 0 <= pod_index < pods:
        raise RankLayoutError(f"pod index {pod_index} is outside 0..{pods - 1}")
    world = pods * ranks_per_pod
    return [RankPlacement(rank=pod_index * ranks_per_pod + local, local_rank=local, world_size=world,
                          pod_index=pod_index, local_world_size=ranks_per_pod) for local in range(ranks_per_pod)]


def _int_env(env: Mapping[str, str], name: str) -> int:
    raw = env.get(name, "")
    try:
        return int(raw)
    except ValueError:
        raise RankLayoutError(f"{name}={raw!r} is not an integer") from None


def pod_from_env(env: Mapping[str, str] | None = None) -> list[RankPlacement] | None:
    """The pod's ranks from RLFLEET_POD_INDEX, RLFLEET_RANKS_PER_POD and WORLD_SIZE (what the chart sets), or None
    when this process is one rank already (RANK set, or no pod variables: a local run)."""
    env = os.environ if env is None else env
    if "RANK" in env or "RLFLEET_RANKS_PER_POD" not in env:
        return None
    per_pod = _int_env(env, "RLFLEET_RANKS_PER_POD")
    world = _int_env(env, "WORLD_SIZE")
    if per_pod < 1 or world % per_pod:
        raise RankLayoutError(f"WORLD_SIZE={world} is not a multiple of RLFLEET_RANKS_PER_POD={per_pod}")
    return pod_ranks(_int_env(env, "RLFLEET_POD_INDEX"), world // per_pod, per_pod)


def rank_env(p: RankPlacement) -> dict[str, str]:
    """The environment torch.distributed and the trainer read for one rank."""
    return {"RANK": str(p.rank), "LOCAL_RANK": str(p.local_rank), "WORLD_SIZE": str(p.world_size),
            "LOCAL_WORLD_SIZE": str(p.local_world_size), "GROUP_RANK": str(p.pod_index)}
