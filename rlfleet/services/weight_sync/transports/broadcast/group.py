"""The trainer-to-replicas broadcast group, in generations: formed at the first publish, and formed again whenever
it was dropped or a replica waits outside it, through a rendezvous the control plane hands out.

Trainer rank 0 opens a TCPStore and registers `{rendezvous, expected}` as the "broadcast" peer "trainer" on the
control plane. The store's key `open` names the generation replicas join next; each generation `n` has its own keys
(`g<n>/joined`, `g<n>/world`, `g<n>/left`) and its own process group (store prefix `weights/g<n>`). A replica reads
`open`, takes a rank with `add("g<n>/joined", 1)` and waits for the trainer to fix `g<n>/world`; a rank that does
not fit (it joined after the size was fixed) joins the next generation instead. The first generation waits up to
`join_seconds` for the expected replicas; later ones are formed at a publish that finds replicas waiting, with a
short wait for the members the previous generation had. Forming sets `open` to the next generation before the size
of this one, so a replica that did not fit always finds where to go.

Each group is a private ProcessGroupGloo (ProcessGroupNCCL on CUDA), never the default process group, so it lives
beside the trainer's own FSDP group. Its port must stay inside the run's network. On the trainer the group's ops
time out after `op_timeout` (a frozen member stalls a publish that long at most); a member waits for the next header
as long as it takes. A member whose stream breaks counts itself out with `add("g<n>/left", 1)`, drops its side and
joins the next generation; the trainer reads `left` and the next generation's `joined` at every publish. `drop`
releases the process group on a daemon thread: destroying a ProcessGroupGloo closes its connections, so the other
members' pending receives fail at once instead of waiting out their op timeout, but the destructor first waits for
ops still in flight, which must not stall the caller (in torch 2.13 gloo's `abort()`/`shutdown()` neither end an op
in flight nor close a connection; for NCCL, `abort()` is what ends them).
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
    generation: int = 0


def key(generation: int, name: str) -> str:
    return f"g{generation}/{name}"


def _process_group(store: dist.Store, generation: int, rank: int, size: int, device: torch.device,
                   timeout: float) -> dist.ProcessGroup:
    prefixed = dist.PrefixStore(f"weights/g{generation}", store)
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
        group.store.add(key(group.generation, "left"), 1)
    except Exception as exc:  # noqa: BLE001 - the store died with the trainer: nobody is left to tell
        log.info("could not record leaving the broadcast group: %s", exc)


class TrainerRendezvous:
    """Trainer rank 0's side: the store (generations, ranks handed out, members gone) and the forming of groups."""

    def __init__(self, host: str, port: int, expected: int, device: torch.device, timeout: float,
                 op_timeout: float | None = None) -> None:
        self.expected = expected
        self.device = device
        self.timeout = timeout
        self.op_timeout = op_timeout or timeout
        self.store = bound_tcp_store(host, port, timedelta(seconds=timeout))     # listens on `host` only
        self.address = f"{host}:{self.store.port}"
        self.generation = 0                         # the generation replicas join next
        self.store.set("open", "0")

    def waiting(self) -> int:
        """Replicas that took a rank in the open generation: outside every group, waiting for it to form."""
        return int(self.store.add(key(self.generation, "joined"), 0))

    def left(self, group: Group) -> int:
        """Members of `group` that recorded their stream breaking."""
        return int(self.store.add(key(group.generation, "left"), 0))

    def form(self, want: int, wait_seconds: float) -> Group | None:
        """Form the open generation: wait (at most wait_seconds) for `want` replicas to have joined it, fix its size
        to those that did and open the next; None when nobody joined."""
        gen = self.generation
        deadline = time.monotonic() + wait_seconds
        joined = self.waiting()
        while joined < want and time.monotonic() < deadline:
            time.sleep(0.05)
            joined = self.waiting()
        self.generation = gen + 1
        self.store.set("open", str(gen + 1))        # before the size: a rank past it finds the next generation
        self.store.set(key(gen, "world"), str(1 + joined))
        if joined < want:
            log.warning("broadcast group %d: %d of %d replicas joined within %.0fs; the others use the gRPC stream "
                        "until the next one forms", gen, joined, want, wait_seconds)
        if joined == 0:
            return None
        pg = _process_group(self.store, gen, 0, 1 + joined, self.device, self.op_timeout)
        log.info("broadcast group %d formed: trainer + %d replicas (%s)", gen, joined, self.device.type)
        return Group(pg, 0, 1 + joined, self.device, generation=gen)


def connect(rendezvous: str, timeout: float) -> dist.Store:
    """A replica's client of the trainer's rendezvous store."""
    host, _, port = rendezvous.rpartition(":")
    return dist.TCPStore(host, int(port), None, False, timedelta(seconds=timeout))


def take_rank(store: dist.Store) -> tuple[int, int]:
    """A replica's first half of joining: (the open generation, the rank taken in it)."""
    gen = int(store.get("open"))
    return gen, int(store.add(key(gen, "joined"), 1))


def await_group(store: dist.Store, generation: int, rank: int, device: torch.device, op_timeout: float,
                wait_seconds: float) -> Group | None:
    """The second half: wait (up to wait_seconds: the next publish that finds this replica waiting) for the trainer
    to form the generation. A Group, or None when it formed without this rank."""
    store.wait([key(generation, "world")], timedelta(seconds=wait_seconds))
    size = int(store.get(key(generation, "world")))
    if rank >= size:
        log.info("broadcast group %d formed without this replica (rank %d, size %d)", generation, rank, size)
        return None
    return Group(_process_group(store, generation, rank, size, device, op_timeout), rank, size, device, store,
                 generation)


def join(store: dist.Store, device: torch.device, op_timeout: float, wait_seconds: float) -> Group | None:
    """Both halves: a Group in the open generation, or None when it formed without this replica."""
    gen, rank = take_rank(store)
    return await_group(store, gen, rank, device, op_timeout, wait_seconds)
