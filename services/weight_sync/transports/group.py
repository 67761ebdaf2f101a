"""The trainer-to-replicas broadcast group: formed once per run through a rendezvous the control plane hands out.

Trainer rank 0 opens a TCPStore, registers `{rendezvous, expected}` as the "broadcast" peer "trainer" on the control
plane, and at its first publish waits (up to `join_seconds`) for the expected replicas to join. Each replica looks
the rendezvous up, takes a rank with `store.add("joined", 1)` and waits for the trainer to fix the group size. A
replica whose rank does not fit (late, or more replicas than expected) is told so and uses the gRPC stream instead.
The group is a private ProcessGroupGloo (ProcessGroupNCCL on CUDA), never the default process group, so it lives
beside the trainer's own FSDP group. Its port must stay inside the run's network.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

PEER_ID = "trainer"
TRANSPORT = "broadcast"


@dataclass
class Group:
    pg: dist.ProcessGroup
    rank: int
    size: int
    device: torch.device


def _process_group(store: dist.Store, rank: int, size: int, device: torch.device, timeout: float) -> dist.ProcessGroup:
    prefixed = dist.PrefixStore("weights", store)
    if device.type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timedelta(seconds=timeout)
        return dist.ProcessGroupNCCL(prefixed, rank, size, opts)
    return dist.ProcessGroupGloo(prefixed, rank, size, timedelta(seconds=timeout))


def broadcast(group: Group, t: torch.Tensor) -> dist.Work:
    """Asynchronous broadcast from rank 0 (the trainer) of `t` in place."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    return group.pg.broadcast([t], opts)


class TrainerRendezvous:
    """Trainer rank 0's side: the store, and the group once formed."""

    def __init__(self, host: str, port: int, expected: int, device: torch.device, timeout: float) -> None:
        self.expected = expected
        self.device = device
        self.timeout = timeout
        self.store = dist.TCPStore(host, port, None, True, timedelta(seconds=timeout), wait_for_workers=False)
        self.address = f"{host}:{self.store.port}"
        self.group: Group | None = None

    def form(self, join_seconds: float) -> Group | None:
        """Wait for the expected replicas (at most join_seconds), fix the group; None when nobody joined."""
        deadline = time.monotonic() + join_seconds
        joined = self.store.add("joined", 0)
        while joined < self.expected and time.monotonic() < deadline:
            time.sleep(0.05)
            joined = self.store.add("joined", 0)
        members = min(joined, self.expected)
        self.store.set("world", str(1 + members))
        if joined < self.expected:
            log.warning("broadcast group: %d of %d replicas joined within %.0fs; the others use the gRPC stream",
                        joined, self.expected, join_seconds)
        if members == 0:
            return None
        pg = _process_group(self.store, 0, 1 + members, self.device, self.timeout)
        self.group = Group(pg, 0, 1 + members, self.device)
        log.info("broadcast group formed: trainer + %d replicas (%s)", members, self.device.type)
        return self.group


def join(rendezvous: str, device: torch.device, timeout: float, op_timeout: float) -> Group | None:
    """A replica's side: a Group, or None when the trainer formed the group without it."""
    host, _, port = rendezvous.rpartition(":")
    store = dist.TCPStore(host, int(port), None, False, timedelta(seconds=timeout))
    rank = int(store.add("joined", 1))
    store.wait(["world"], timedelta(seconds=timeout))
    size = int(store.get("world"))
    if rank >= size:
        log.info("broadcast group at %s formed without this replica (rank %d, size %d)", rendezvous, rank, size)
        return None
    return Group(_process_group(store, rank, size, device, op_timeout), rank, size, device)
