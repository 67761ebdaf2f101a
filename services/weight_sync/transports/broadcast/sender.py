"""Send side of the broadcast transport: buckets filled per parameter and broadcast while the next one fills.

Trainer rank 0 holds a BroadcastSender; every other trainer rank iterates the same ShardedState (`drain()`) so the
per-parameter all-gathers happen on all ranks. Per version: header, bucket table, then each bucket as soon as it
is complete (double-buffered: bucket i is on the wire while bucket i+1 is gathered and copied). Replicas that are
not in the group get the same buckets from the gRPC stream (a BucketedSender on the same machine) instead.

Losing the group: a broadcast op that fails (a member died) drops the group, the rest of the tensors are still read
(the gathers are collectives the other trainer ranks are in) without being sent, and `stage` raises GroupLost: the
caller stages the version again. A member that recorded leaving (group.py) drops the group at the next `stage`.
Without a group every version goes to every replica over the gRPC stream (manifest options `members: "0"`,
`fallback: bucketed`); a replica that joined after the group formed (a restarted one) gets the gRPC stream as well.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch

from rlfleet.v1 import weight_sync_pb2, weights_pb2
from services.weight_sync.transports.broadcast.group import (
    PEER_ID,
    TRANSPORT,
    Group,
    TrainerRendezvous,
    broadcast,
    drop,
)
from services.weight_sync.transports.broadcast.wire import CLOSE, header_tensor, table_tensor
from services.weight_sync.transports.bucketed.sender import BucketedSender, StagedVersion
from services.weight_sync.transports.errors import GroupLost
from services.weight_sync.transports.fill import BucketFiller, emission_order
from services.weight_sync.transports.layout import Layout, plan
from services.weight_sync.transports.planned import build_manifest
from services.weight_sync.transports.sharded import materialize

log = logging.getLogger(__name__)


def _why(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"


class BroadcastSender:
    """Trainer rank 0. `stage(version, step, named_tensors) -> manifest` broadcasts, then the caller publishes."""

    def __init__(self, fallback: BucketedSender, register: Callable[[weight_sync_pb2.PeerInfo], None],
                 expected_replicas: int, rendezvous_host: str = "127.0.0.1", rendezvous_port: int = 0,
                 device: torch.device | str = "cpu", join_seconds: float = 60.0, timeout: float = 600.0) -> None:
        self.fallback = fallback
        self.bucket_bytes = fallback.bucket_bytes
        self.device = torch.device(device)
        self.join_seconds = join_seconds
        self._rdv = TrainerRendezvous(rendezvous_host, rendezvous_port, expected_replicas, self.device, timeout)
        self._pool: list[torch.Tensor] = []       # bucket buffers reused across versions
        self._group: Group | None = None
        self._formed = False
        self.lost = ""                  # why the group was dropped ("" while it lives or before it formed)
        register(weight_sync_pb2.PeerInfo(peer_id=PEER_ID, transport=TRANSPORT, options={
            "rendezvous": self._rdv.address, "expected": str(expected_replicas), "device": self.device.type}))

    @property
    def endpoint(self) -> str:
        return self.fallback.endpoint

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
            try:
                self._group = self._rdv.form(self.join_seconds)
            except Exception as exc:  # noqa: BLE001 - a replica died between taking a rank and connecting
                self.lost = f"the broadcast group did not form: {_why(exc)}"
                log.warning("%s; every replica gets the weights over the gRPC stream", self.lost)
        left = self._rdv.left() if self._group is not None else 0
        if left:
            self._drop(f"{left} member(s) left the group")
        specs, tensors = materialize(named_tensors)
        layout = plan(specs, self.bucket_bytes)
        group = self._group
        need_fallback = group is None or self.members < self._rdv.expected or self._rdv.joined() > self.members
        flat: np.ndarray | None = np.zeros(layout.total_bytes, dtype=np.uint8) if need_fallback else None
        filler = BucketFiller(layout, specs, group.device if group else "cpu", self._pool)
        source = iter(tensors)
        broken = self._send(group, version, layout, filler, source, flat)
        left = self._rdv.left() if group is not None and not broken else 0
        if left:                              # a member that a tree broadcast hid from us broke off on the way
            broken = f"{left} member(s) left the group during the broadcast"
        if broken:
            group = None                      # no frame of this call may keep the group alive (see group.drop)
            self._drop(broken)                # first: the surviving members' receives end now, not after the drain
            for _ in source:                  # the other trainer ranks gather the remaining tensors too
                pass
            raise GroupLost(version, broken)
        options = {"members": str(self.members)}
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

    def _drop(self, why: str) -> None:
        if self._group is not None:
            log.warning("broadcast group dropped (%s): every replica gets later versions over the gRPC stream", why)
            drop(self._group)
            self._group = None
            self.lost = why

    def close(self) -> None:
        if self._group is not None:
            try:
                broadcast(self._group, header_tensor(CLOSE, 0, 0).to(self._group.device)).wait()
            except RuntimeError as exc:
                log.info("closing the broadcast group: %s", exc)
            self._group = None                # released here: nothing is in flight after CLOSE
        self.fallback.close()
