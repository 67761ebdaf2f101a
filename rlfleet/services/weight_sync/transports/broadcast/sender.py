"""Send side of the broadcast transport: buckets filled per parameter and broadcast while the next one fills.

Trainer rank 0 holds a BroadcastSender; every other trainer rank iterates the same ShardedState (`drain()`) so the
per-parameter all-gathers happen on all ranks. Per version: header, bucket table, then each bucket as soon as it
is complete (double-buffered: bucket i is on the wire while bucket i+1 is gathered and copied). Replicas that are
not in the group get the same buckets from the gRPC stream (a BucketedSender on the same machine) instead.

Losing the group: a broadcast op that fails (a member died, or stalled past `op_timeout`) drops the group, the rest
of the tensors are still read (the gathers are collectives the other trainer ranks are in) without being sent, and
`stage` raises GroupLost: the caller stages the version again. A member that recorded leaving (group.py) drops the
group at the next `stage`. The group comes back: a `stage` that finds replicas waiting in the open generation (the
survivors of a dropped group, a restarted or added replica, one that did not fit) forms the next generation first;
a live group is ended with a REFORM header so its members join the next one too, and the trainer waits up to
`reform_seconds` for the members it expects. Without a group a version goes to every replica over the gRPC stream
(manifest options `members: "0"`, `fallback: bucketed`); while any replica waits outside the group the stream is
staged beside the broadcast. Manifests sent to a group name its `generation`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch

from rlfleet.services.weight_sync.transports.broadcast.group import (
    PEER_ID,
    TRANSPORT,
    Group,
    TrainerRendezvous,
    broadcast,
    drop,
)
from rlfleet.services.weight_sync.transports.broadcast.wire import CLOSE, REFORM, header_tensor, table_tensor
from rlfleet.services.weight_sync.transports.bucketed.sender import BucketedSender, StagedVersion
from rlfleet.services.weight_sync.transports.errors import GroupLost
from rlfleet.services.weight_sync.transports.fill import BucketFiller, emission_order
from rlfleet.services.weight_sync.transports.layout import Layout, plan
from rlfleet.services.weight_sync.transports.planned import build_manifest
from rlfleet.services.weight_sync.transports.sharded import materialize
from rlfleet.v1 import weight_sync_pb2, weights_pb2

log = logging.getLogger(__name__)


def _why(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


class BroadcastSender:
    """Trainer rank 0. `stage(version, step, named_tensors) -> manifest` broadcasts, then the caller publishes."""

    def __init__(self, fallback: BucketedSender, register: Callable[[weight_sync_pb2.PeerInfo], None],
                 expected_replicas: int, rendezvous_host: str = "127.0.0.1", rendezvous_port: int = 0,
                 device: torch.device | str = "cpu", join_seconds: float = 60.0, timeout: float = 600.0,
                 op_timeout: float | None = None, reform_seconds: float = 10.0) -> None:
        self.fallback = fallback
        self.bucket_bytes = fallback.bucket_bytes
        self.device = torch.device(device)
        self.join_seconds = join_seconds
        self.reform_seconds = reform_seconds
        self._rdv = TrainerRendezvous(rendezvous_host, rendezvous_port, expected_replicas, self.device, timeout,
                                      op_timeout)
        self._last_members = 0          # members of the last group formed (whom a re-formed group waits for)
        self._pool: list[torch.Tensor] = []       # bucket buffers reused across versions
        self._group: Group | None = None
        self._formed = False
        self.lost = ""                  # why the group was dropped ("" while it lives or before it formed)
        self.losses: list[str] = []     # every drop's reason, oldest first
        register(weight_sync_pb2.PeerInfo(peer_id=PEER_ID, transport=TRANSPORT, options={
            "rendezvous": self._rdv.address, "expected": str(expected_replicas), "device": self.device.type}))

    @property
    def endpoint(self) -> str:
        return self.fallback.endpoint

    @property
    def waiting(self) -> int:
        """Replicas waiting outside the group for the next generation (the next stage takes them in)."""
        return self._rdv.waiting()

    @property
    def members(self) -> int:
        """Replicas in the group (0 before the first publish, when none joined, or once the group was dropped)."""
        return self._group.size - 1 if self._group else 0

    def stage(self, version: int, step: int,
              named_tensors: Iterable[tuple[str, torch.Tensor]]) -> weights_pb2.WeightManifest:
        """Broadcast the version (and stage it on the gRPC stream for replicas outside the group); GroupLost when the
        group broke on the way: every tensor has been read all the same, and nothing of this version is staged."""
        if not self._formed:
            self._formed = True
            self._form(self._rdv.expected, self.join_seconds)
        elif self._group is not None and self._rdv.left(self._group):
            self._drop(f"{self._rdv.left(self._group)} member(s) left the group")
        waiting = self._rdv.waiting()
        if waiting and self._group is not None:           # take them in: this generation's members move too
            want = self.members + waiting
            self._reform()
            self._form(want, self.reform_seconds)
        elif waiting:                                     # after a drop: wait a little for the members it had
            self._form(max(waiting, self._last_members), self.reform_seconds)
        specs, tensors = materialize(named_tensors)
        layout = plan(specs, self.bucket_bytes)
        group = self._group
        need_fallback = group is None or self.members < self._rdv.expected or self._rdv.waiting() > 0
        flat: np.ndarray | None = np.zeros(layout.total_bytes, dtype=np.uint8) if need_fallback else None
        filler = BucketFiller(layout, specs, group.device if group else "cpu", self._pool)
        source = iter(tensors)
        broken = self._send(group, version, layout, filler, source, flat)
        left = self._rdv.left(group) if group is not None and not broken else 0
        if left:                              # a member that a tree broadcast hid from us broke off on the way
            broken = f"{left} member(s) left the group during the broadcast"
        if broken:
            group = None                      # no frame of this call may keep the group alive (see group.drop)
            self._drop(broken)                # first: the surviving members' receives end now, not after the drain
            for _ in source:                  # the other trainer ranks gather the remaining tensors too
                pass
            raise GroupLost(version, broken)
        options = {"members": str(self.members)}
        if group is not None:
            options["generation"] = str(group.generation)
        if flat is not None:
            options["fallback"] = "bucketed"
        manifest = build_manifest(version, step, TRANSPORT, self.endpoint, layout, specs, filler.hashes, options)
        if flat is not None:
            fb = weights_pb2.WeightManifest()
            fb.CopyFrom(manifest)
            fb.transport = "bucketed"
            self.fallback.put(StagedVersion(fb, layout, flat))
        log.info("broadcast version %d: %d buckets, %d bytes to %d replicas%s", version, layout.num_buckets,
                 layout.total_bytes, self.members, " (+ gRPC fallback)" if flat is not None else "")
        return manifest

    def _send(self, group: Group | None, version: int, layout: Layout, filler: BucketFiller,
              source: Iterator[tuple[str, torch.Tensor]], flat: np.ndarray | None) -> str:
        """Fill every bucket from `source`, broadcast it (if a group) and copy it into `flat` (if given).

        Returns "" or, when a broadcast op failed, why: then `source` is left where the failure found it.
        """
        filled = filler.fill(source)
        pending: tuple[torch.distributed.Work, torch.Tensor] | None = None
        try:
            if group is not None:
                try:
                    broadcast(group, header_tensor(version, layout.num_buckets, layout.total_bytes)
                              .to(group.device)).wait()
                    broadcast(group, table_tensor(layout.bucket_sizes, emission_order(layout))
                              .to(group.device)).wait()
                except Exception as exc:  # noqa: BLE001 - any failed op means the group is gone
                    return _why(exc)
            for b, buf in filled:
                try:
                    work = broadcast(group, buf) if group is not None else None
                except Exception as exc:  # noqa: BLE001
                    return _why(exc)
                if flat is not None:
                    s = layout.bucket_starts[b]
                    flat[s:s + buf.numel()] = buf.cpu().numpy()
                if pending is not None:
                    try:
                        pending[0].wait()                        # bucket i-1 has left; its buffer is free again
                    except Exception as exc:  # noqa: BLE001
                        return _why(exc)
                    filler.release(pending[1])
                    pending = None
                if work is None:
                    filler.release(buf)
                else:
                    pending = (work, buf)
            if pending is not None:
                try:
                    pending[0].wait()
                except Exception as exc:  # noqa: BLE001
                    return _why(exc)
            return ""
        finally:
            filled.close()

    def _form(self, want: int, wait_seconds: float) -> None:
        try:
            self._group = self._rdv.form(want, wait_seconds)
        except Exception as exc:  # noqa: BLE001 - a replica died between taking a rank and connecting
            self._group = None
            self.lost = f"the broadcast group did not form: {_why(exc)}"
            log.warning("%s; every replica gets the weights over the gRPC stream", self.lost)
            return
        if self._group is not None:
            self._last_members = self.members
            self.lost = ""

    def _reform(self) -> None:
        """End the live generation with a REFORM header; its members join the open one."""
        assert self._group is not None
        try:
            broadcast(self._group, header_tensor(REFORM, 0, 0).to(self._group.device)).wait()
        except Exception as exc:  # noqa: BLE001 - the group is gone anyway
            log.info("ending broadcast group %d: %s", self._group.generation, _why(exc))
        drop(self._group)
        self._group = None

    def _drop(self, why: str) -> None:
        if self._group is not None:
            log.warning("broadcast group %d dropped (%s): the gRPC stream serves until the next generation forms",
                        self._group.generation, why)
            drop(self._group)
            self._group = None
            self.lost = why
            self.losses.append(why)

    def close(self) -> None:
        if self._group is not None:
            try:
                broadcast(self._group, header_tensor(CLOSE, 0, 0).to(self._group.device)).wait()
            except RuntimeError as exc:
                log.info("closing the broadcast group: %s", exc)
            self._group = None                # released here: nothing is in flight after CLOSE
        self.fallback.close()
