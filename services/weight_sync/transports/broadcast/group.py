"""The trainer-to-replicas broadcast group: formed once per run through a rendezvous the control plane hands out.

Trainer rank 0 opens a TCPStore, registers `{rendezvous, expected}` as the "broadcast" peer "trainer" on the control
plane, and at its first publish waits (up to `join_seconds`) for the expected replicas to join. Each replica looks
the rendezvous up, takes a rank with `store.add("joined", 1)` and waits for the trainer to fix the group size. A
replica whose rank does not fit (late, or more replicas than expected) is told so and uses the gRPC stream instead.
The group is a private ProcessGroupGloo (ProcessGroupNCCL on CUDA), never the default process group, so it lives
beside the trainer's own FSDP group. Its port must stay inside the run's network.

The group is never re-formed. A member whose stream breaks counts itself out with `store.add("left", 1)` and drops
its side; the trainer reads "left" and "joined" at every publish (a member gone, a replica restarted after the group
formed) and drops its side when a member left or an op failed. `drop` releases the process group on a daemon thread:
destroying a ProcessGroupGloo closes its connections, so the other members' pending receives fail at once instead
of waiting out their op timeout, but the destructor first waits for ops still in flight, which must not stall the
caller (in torch 2.13 gloo's `abort()`/`shutdown()` neither end an op in flight nor close a connection; for NCCL,
`abort()` is what ends them).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from rlfleet.security.bound_store import bound_tcp_store

log = logging.getLogger(__name__)

PEER_ID = "trainer"
TRANSPORT = "broadcast"


@dataclass
class Group:
    pg: dist.ProcessGroup | None      # None once dropped
    rank: int
    size: int
    device: torch.device
    store: dist.Store | None = None   # a replica's client of the rendezvous store (where it records leaving)


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
    if group.pg is None:
        raise RuntimeError("the broadcast group was dropped")
    return group.pg.broadcast([t], opts)


def _release(holder: list[dist.ProcessGroup]) -> None:
    try:
        holder[0].abort()
    except Exception as exc:  # noqa: BLE001 - a backend without abort is released all the same
        log.debug("broadcast group abort: %s", exc)
    holder.clear()          # the last reference: the destructor closes the connections (after any op in flight)


def drop(group: Group) -> None:
    """Leave the group without waiting: the process group is aborted and released on a daemon thread."""
    holder = [group.pg] if group.pg is not None else []     # no local names the group: the thread releases it
    group.pg = None
    if holder:
        threading.Thread(target=_release, args=(holder,), name="broadcast-group-drop", daemon=True).start()


def record_left(group: Group) -> None:
    """A replica whose stream broke counts itself out in the rendezvous store (the trainer may not have noticed)."""
    if group.store is None:
        return
    try:
        group.store.add("left", 1)
    except Exception as exc:  # noqa: BLE001 - the store died with the trainer: nobody is left to tell
        log.info("could not record leaving the broadcast group: %s", exc)


class TrainerRendezvous:
    """Trainer rank 0's side: the store (ranks handed out, members gone) and the forming of the group."""

    def __init__(self, host: str, port: int, expected: int, device: torch.device, timeout: float) -> None:
        self.expected = expected
        self.device = device
        self.timeout = timeout
        self.store = bound_tcp_store(host, port, timedelta(seconds=timeout))     # listens on `host` only
        self.address = f"{host}:{self.store.port}"

    def joined(self) -> int:
        """Replicas that ever took a rank (members, late ones and restarted ones alike)."""
        return int(self.store.add("joined", 0))

    def left(self) -> int:
        """Members that recorded their stream breaking."""
        return int(self.store.add("left", 0))

    def form(self, join_seconds: float) -> Group | None:
        """Wait for the expected replicas (at most join_seconds), fix the group; None when nobody joined."""
        deadline = time.monotonic() + join_seconds
        joined = self.joined()
        while joined < self.expected and time.monotonic() < deadline:
            time.sleep(0.05)
            joined = self.joined()
        members = min(joined, self.expected)
        self.store.set("world", str(1 + members))
        if joined < self.expected:
            log.warning("broadcast group: %d of %d replicas joined within %.0fs; the others use the gRPC stream",
                        joined, self.expected, join_seconds)
        if members == 0:
            return None
        pg = _process_group(self.store, 0, 1 + members, self.device, self.timeout)
        log.info("broadcast group formed: trainer + %d replicas (%s)", members, self.device.type)
        return Group(pg, 0, 1 + members, self.device)


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
    return Group(_process_group(store, rank, size, device, op_timeout), rank, size, device, store)
