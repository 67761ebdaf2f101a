"""Send side of the broadcast transport: buckets filled per parameter and broadcast while the next one fills.

Trainer rank 0 holds a BroadcastSender; every other trainer rank iterates the same ShardedState (`drain()`) so the
per-parameter all-gathers happen on all ranks. Per version: header, bucket table, then each bucket as soon as it
is complete (double-buffered: bucket i is on the wire while bucket i+1 is gathered and copied). Replicas that are
not in the group get the same buckets from the gRPC stream (a BucketedSender on the same machine) instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import numpy as np
import torch

from rlfleet.v1 import weight_sync_pb2, weights_pb2
from services.weight_sync.transports.broadcast_wire import CLOSE, header_tensor, table_tensor
from services.weight_sync.transports.bucketed_sender import BucketedSender, StagedVersion
from services.weight_sync.transports.fill import BucketFiller, emission_order
from services.weight_sync.transports.group import PEER_ID, TRANSPORT, Group, TrainerRendezvous, broadcast
from services.weight_sync.transports.layout import plan
from services.weight_sync.transports.planned import build_manifest
from services.weight_sync.transports.sharded import materialize

log = logging.getLogger(__name__)


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
        self._group: Group | None = None
        self._formed = False
        register(weight_sync_pb2.PeerInfo(peer_id=PEER_ID, transport=TRANSPORT, options={
            "rendezvous": self._rdv.address, "expected": str(expected_replicas), "device": self.device.type}))

    @property
    def endpoint(self) -> str:
        return self.fallback.endpoint

    @property
    def members(self) -> int:
        """Replicas in the group (0 before the first publish or when none joined)."""
        return self._group.size - 1 if self._group else 0

    def stage(self, version: int, step: int,
              named_tensors: Iterable[tuple[str, torch.Tensor]]) -> weights_pb2.WeightManifest:
        if not self._formed:
            self._group = self._rdv.form(self.join_seconds)
            self._formed = True
        specs, tensors = materialize(named_tensors)
        layout = plan(specs, self.bucket_bytes)
        need_fallback = self.members < self._rdv.expected
        flat = np.zeros(layout.total_bytes, dtype=np.uint8) if need_fallback else None
        group = self._group
        if group is not None:
            broadcast(group, header_tensor(version, layout.num_buckets, layout.total_bytes).to(group.device)).wait()
            broadcast(group, table_tensor(layout.bucket_sizes, emission_order(layout)).to(group.device)).wait()
        filler = BucketFiller(layout, specs, group.device if group else "cpu")
        pending: tuple[torch.distributed.Work, torch.Tensor] | None = None
        for b, buf in filler.fill(tensors):
            work = broadcast(group, buf) if group is not None else None
            if flat is not None:
                s = layout.bucket_starts[b]
                flat[s:s + buf.numel()] = buf.cpu().numpy()
            if pending is not None:
                pending[0].wait()                            # bucket i-1 has left; its buffer is free again
                filler.release(pending[1])
            if work is None:
                filler.release(buf)
            else:
                pending = (work, buf)
        if pending is not None:
            pending[0].wait()
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

    def close(self) -> None:
        if self._group is not None:
            try:
                broadcast(self._group, header_tensor(CLOSE, 0, 0).to(self._group.device)).wait()
            except RuntimeError as exc:
                log.info("closing the broadcast group: %s", exc)
            self._group = None
        self.fallback.close()
