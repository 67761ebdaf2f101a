"""Receive side of the broadcast transport: a thread that keeps the replica in the trainer's group, generation after
generation (group.py), and keeps the last versions received.

The trainer broadcasts a version *before* it publishes the manifest, so the replica receives while it generates;
`fetch(manifest)` then waits for that version's bytes, checks every hash against the manifest and returns tensors.
A broken stream (trainer or another member died mid-broadcast, a bucket missing) marks that version failed with the
reason and ends this replica's membership: it records leaving in the rendezvous store (the trainer may not have
noticed: gloo broadcasts along a tree), drops its side, so the members downstream of it fail at once too, and joins
the next generation. A REFORM header (the trainer is taking waiting replicas in) ends the membership the same way,
without a failure. Nothing of a failed version is returned from the group; a version sent to a generation this
replica is not in (manifest option `generation`) comes over the gRPC stream when the manifest offers it
(`fallback: bucketed`). A manifest with `members: "0"` was sent to no group: it is fetched over the gRPC stream at
once. When the trainer closes the group or its store goes away (a trainer restart), the replica looks the
rendezvous up again and joins the new trainer's first generation.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import torch
import torch.distributed as dist

from rlfleet.security.identity import Credential
from rlfleet.services.weight_sync.transports.broadcast.group import (
    PEER_ID,
    TRANSPORT,
    Group,
    await_group,
    broadcast,
    connect,
    drop,
    record_left,
    take_rank,
)
from rlfleet.services.weight_sync.transports.broadcast.wire import CLOSE, HEADER_LEN, REFORM, parse
from rlfleet.services.weight_sync.transports.bucketed.receiver import fetch as fetch_bucketed
from rlfleet.services.weight_sync.transports.bucketed.receiver import unpack
from rlfleet.services.weight_sync.transports.errors import WeightTransferError
from rlfleet.services.weight_sync.transports.layout import checked_layout
from rlfleet.v1 import weight_sync_pb2, weights_pb2

log = logging.getLogger(__name__)

KEEP = 2                            # versions kept received but not yet fetched
IDLE_OP_TIMEOUT = 24 * 3600.0       # a member waits this long for the next header


class BroadcastReceiver:
    """One replica's membership of the broadcast group (joined in the background at start-up)."""

    def __init__(self, peers: Callable[[str, int, float], list[weight_sync_pb2.PeerInfo]],
                 device: torch.device | str = "cpu", join_seconds: float = 120.0,
                 op_timeout: float = IDLE_OP_TIMEOUT) -> None:
        self._peers = peers
        self.device = torch.device(device)
        self._join_seconds = join_seconds
        self._op_timeout = op_timeout
        self._cond = threading.Condition()
        self._received: OrderedDict[int, torch.Tensor] = OrderedDict()   # version -> flat [total_bytes] uint8
        self._failed: dict[int, str] = {}
        self.member = False           # in a group now
        self.generation = -1          # the generation of the group this replica is (or was last) in
        self.joined: list[int] = []   # every generation it joined, in order (a fact; `member` is only the present)
        self._pending = -1            # the generation it took a rank in and waits to see formed
        self.from_group = 0           # versions fetched from the group
        self.from_stream = 0          # versions fetched over the gRPC stream
        self.dead = ""                # why this replica is outside a group now ("" while a member or not yet joined)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broadcast-receiver", daemon=True)
        self._thread.start()

    # --- group thread ----------------------------------------------------------------------------------------------
    def _run(self) -> None:
        done = ""                              # the rendezvous of a trainer that closed its group or went away
        while not self._closed.is_set():
            rendezvous = ""
            try:
                rendezvous = self._find(done)
                self._generations(connect(rendezvous, self._join_seconds))
            except Exception as exc:  # noqa: BLE001 - not joining means the gRPC fallback, not a crash
                if self._closed.is_set():
                    return
                self._end(f"outside the broadcast group: {type(exc).__name__}: {exc}")
                self._closed.wait(1.0)
            done = rendezvous or done

    def _find(self, done: str) -> str:
        """The rendezvous of the trainer registered now (the trainer may start after the replicas: as long as it
        takes), other than one that closed or went away."""
        while True:
            found = [p for p in self._peers(TRANSPORT, 1, 30.0)
                     if p.peer_id == PEER_ID and p.options["rendezvous"] != done]
            if found:
                return found[0].options["rendezvous"]
            if self._closed.wait(1.0):
                raise RuntimeError("closed")

    def _generations(self, store: dist.Store) -> None:
        """Join generation after generation of one trainer's group; returns when the trainer closed it."""
        while True:
            gen, rank = take_rank(store)
            with self._cond:
                self._pending = gen
            group = await_group(store, gen, rank, self.device, self._op_timeout, self._op_timeout)
            with self._cond:
                self._pending = -1
                if group is not None:
                    self.member, self.dead, self.generation = True, "", gen
                    self.joined.append(gen)
                self._cond.notify_all()
            if group is None:
                self._end("the trainer formed the broadcast group without this replica")
                continue
            log.info("joined broadcast group %d as rank %d of %d", gen, group.rank, group.size)
            if self._receive_loop(group) == "closed":
                return

    def _receive_loop(self, group: Group) -> str:
        """Receive versions until the group ends: "closed" (the trainer closed it), "reform" or "broken"."""
        while True:
            version, got, total = -1, 0, 0
            try:
                header = torch.empty(HEADER_LEN, dtype=torch.int64, device=self.device)
                broadcast(group, header).wait()
                version, nb = int(header[1]), int(header[2])
                if version in (CLOSE, REFORM):
                    drop(group)
                    self._end("the trainer closed the broadcast group" if version == CLOSE
                              else "the trainer re-forms the broadcast group")
                    return "closed" if version == CLOSE else "reform"
                table = torch.empty(2 * nb, dtype=torch.int64, device=self.device)
                broadcast(group, table).wait()
                h = parse(header.cpu(), table.cpu())
                total = len(h.order)
                flat = torch.empty(h.total_bytes, dtype=torch.uint8, device=self.device)   # [total_bytes]
                starts = h.starts()
                for b in h.order:
                    broadcast(group, flat[starts[b]:starts[b] + h.sizes[b]]).wait()
                    got += 1
            except Exception as exc:  # noqa: BLE001 - the stream broke: this version is lost, the group is over
                reason = f"broadcast stream truncated after {got} of {total} buckets: {type(exc).__name__}: {exc}"
                record_left(group)            # before fetch hears of it: the trainer's next stage sees "left"
                drop(group)
                with self._cond:
                    if version >= 0:
                        self._failed[version] = reason
                self._end(reason)
                return "broken"
            with self._cond:
                self._received[version] = flat.cpu()
                while len(self._received) > KEEP:
                    self._received.popitem(last=False)
                self._cond.notify_all()

    def _end(self, reason: str) -> None:
        if reason != self.dead:                 # a retry that fails the same way is not news
            log.warning("broadcast group: %s", reason)
        with self._cond:
            self.member, self.dead = False, reason
            self._cond.notify_all()

    def close(self) -> None:
        """Stop looking for groups to join (a membership in progress ends with the process or the trainer's drop)."""
        self._closed.set()

    # --- fetch ------------------------------------------------------------------------------------------------------
    def wait_joined(self, timeout: float) -> bool:
        """True once this replica has joined a group, even if it has lost it since (see `member` for now); False
        when it was counted out (`dead` says why) or the timeout passed first. Asking `member` here raced: a group
        joined and lost before the waiter woke up read as never joined."""
        with self._cond:
            self._cond.wait_for(lambda: bool(self.joined) or bool(self.dead), timeout)
            return bool(self.joined)

    def fetch(self, manifest: weights_pb2.WeightManifest, token: Credential, timeout: float,
              replica_id: str = "") -> list[tuple[str, torch.Tensor]]:
        """The version's tensors, checked against the manifest; WeightTransferError if it did not arrive whole."""
        version = manifest.version
        layout = checked_layout(manifest, TRANSPORT)
        deadline = time.monotonic() + timeout
        sent_to_group = manifest.options.get("members") != "0"
        gen = int(manifest.options.get("generation", "0"))

        def settled() -> bool:          # received, failed, or this replica is in no position to receive it
            if version in self._received or version in self._failed:
                return True
            return not ((self.member and self.generation == gen) or self._pending == gen)

        with self._cond:
            if sent_to_group:
                self._cond.wait_for(settled, max(0.0, deadline - time.monotonic()))
            flat = self._received.get(version)
            failed = self._failed.get(version)
        if flat is not None:
            if flat.numel() != layout.total_bytes:
                raise WeightTransferError(version, f"received {flat.numel()} bytes, manifest lays out "
                                                   f"{layout.total_bytes}")
            self.from_group += 1
            return unpack(manifest, layout, flat)
        if not sent_to_group:
            reason = "the trainer sent this version to no group"
        else:
            reason = failed or self.dead or f"version not received within {timeout:.0f}s"
        if manifest.options.get("fallback") == "bucketed":
            fb = weights_pb2.WeightManifest()
            fb.CopyFrom(manifest)
            fb.transport = "bucketed"
            log.info("version %d over the gRPC stream (%s)", version, reason)
            got = fetch_bucketed(fb, token, max(1.0, deadline - time.monotonic()), replica_id)
            self.from_stream += 1
            return got
        raise WeightTransferError(version, reason)
