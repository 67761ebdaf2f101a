"""Send side of NIXL P2P: every trainer rank WRITEs the buckets of the replicas the transfer plan gives it.

Transfer plan: replicas (as registered on the control plane, sorted by id) are dealt to trainer ranks round-robin,
`plan_for(rank, world, peers)`. Every rank iterates the same ShardedState (per-parameter all-gathers), fills its own
buckets, and writes each bucket into slot `version % slots` of each of its replicas, double-buffered: bucket i is
in flight while bucket i+1 fills. When all writes to a replica are DONE it gets the notification
`rlfleet:<version>:<digest>`. A replica whose transfer fails is reported and skipped; the others still get the version.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence

import torch

from rlfleet.services.weight_sync.transports.fill import BucketFiller
from rlfleet.services.weight_sync.transports.layout import aligned_bucket_bytes, plan
from rlfleet.services.weight_sync.transports.nixl.agent import TRANSPORT, done_message, make_agent, wait_xfer
from rlfleet.services.weight_sync.transports.planned import build_manifest
from rlfleet.services.weight_sync.transports.sharded import materialize
from rlfleet.v1 import weight_sync_pb2, weights_pb2

log = logging.getLogger(__name__)


def plan_for(rank: int, world: int, peers: Sequence[weight_sync_pb2.PeerInfo]) -> list[weight_sync_pb2.PeerInfo]:
    """The replicas trainer `rank` of `world` writes to."""
    ordered = sorted(peers, key=lambda p: p.peer_id)
    return [p for i, p in enumerate(ordered) if i % world == rank]


class NixlSender:
    def __init__(self, peers: Callable[[str, int, float], list[weight_sync_pb2.PeerInfo]], bucket_bytes: int,
                 rank: int = 0, world: int = 1, device: torch.device | str = "cpu", endpoint: str = "",
                 expected_replicas: int = 0, wait_seconds: float = 60.0, timeout: float = 600.0) -> None:
        self._peers = peers
        self.bucket_bytes = aligned_bucket_bytes(bucket_bytes)
        self.rank, self.world = rank, world
        self.device = torch.device(device)
        self.endpoint = endpoint or f"nixl:trainer-{rank}"
        self.expected = expected_replicas
        self.wait_seconds = wait_seconds
        self.timeout = timeout
        self.agent = make_agent(f"trainer-{rank}")
        self._registered: set[int] = set()
        self._pool: list[torch.Tensor] = []       # bucket buffers reused across versions: registered once
        self._known: dict[str, bytes] = {}       # remote agent name -> metadata added
        self.failed: dict[str, str] = {}         # replica -> why its last transfer failed
        self._staged_once = False

    def _register(self, buf: torch.Tensor) -> None:
        base = buf._base if buf._base is not None else buf
        if base.data_ptr() not in self._registered:
            self.agent.register_memory([base])
            self._registered.add(base.data_ptr())

    def _targets(self) -> list[weight_sync_pb2.PeerInfo]:
        """The replicas registered now; the first publish waits (up to wait_seconds) for the expected ones, later
        ones take whoever is registered (replicas may be scaled away or added mid-run)."""
        first = not self._staged_once
        self._staged_once = True
        peers = self._peers(TRANSPORT, self.expected if first else 0, self.wait_seconds if first else 0.0)
        mine = plan_for(self.rank, self.world, peers)
        for p in mine:
            if self._known.get(p.agent_name) != p.agent_metadata:
                self.agent.add_remote_agent(p.agent_metadata)
                self._known[p.agent_name] = p.agent_metadata
        return mine

    def stage(self, version: int, step: int,
              named_tensors: Iterable[tuple[str, torch.Tensor]]) -> weights_pb2.WeightManifest:
        specs, tensors = materialize(named_tensors)
        layout = plan(specs, self.bucket_bytes)
        targets = self._targets()
        self.failed = {}
        for p in targets:
            if layout.total_bytes > p.capacity_bytes:
                self.failed[p.peer_id] = f"{layout.total_bytes} bytes exceed its {p.capacity_bytes}-byte slot"
        filler = BucketFiller(layout, specs, self.device, self._pool)
        pending: list[tuple[torch.Tensor, list[tuple[str, object]]]] = []
        for b, buf in filler.fill(tensors):
            self._register(buf)
            handles = [(p.peer_id, h) for p in targets if p.peer_id not in self.failed
                       for h in [self._write(p, version, layout.bucket_starts[b], buf)] if h is not None]
            pending.append((buf, handles))
            if len(pending) > 1:                 # double-buffered: wait for bucket i-1 while bucket i is in flight
                self._finish(*pending.pop(0), filler)
        for item in pending:
            self._finish(*item, filler)
        manifest = build_manifest(version, step, TRANSPORT, self.endpoint, layout, specs, filler.hashes,
                                  {"writers": str(self.world)})
        message = done_message(version, manifest.digest)
        for p in targets:
            if p.peer_id in self.failed:
                log.error("NIXL: replica %s did not get version %d: %s", p.peer_id, version, self.failed[p.peer_id])
                continue
            self.agent.send_notif(p.agent_name, message)
        log.info("NIXL rank %d wrote version %d (%d bytes) to %d of %d replicas", self.rank, version,
                 layout.total_bytes, len(targets) - len(self.failed), len(targets))
        return manifest

    def _write(self, p: weight_sync_pb2.PeerInfo, version: int, offset: int, buf: torch.Tensor) -> object | None:
        try:
            remote = self.agent.get_xfer_descs(
                [(p.base_address + (version % p.slots) * p.capacity_bytes + offset, buf.numel(), p.device_id)],
                p.mem_type)
            handle = self.agent.initialize_xfer("WRITE", self.agent.get_xfer_descs([buf]), remote, p.agent_name)
            if self.agent.transfer(handle) == "ERR":
                raise RuntimeError("transfer refused")
            return handle
        except Exception as exc:  # noqa: BLE001 - one replica's failure must not stop the others
            self.failed[p.peer_id] = f"WRITE failed: {type(exc).__name__}: {exc}"
            return None

    def _finish(self, buf: torch.Tensor, handles: list[tuple[str, object]], filler: BucketFiller) -> None:
        deadline = time.monotonic() + self.timeout
        for peer_id, h in handles:
            state = wait_xfer(self.agent, h, deadline)
            if state != "DONE":
                self.failed.setdefault(peer_id, f"WRITE ended {state}")
            try:
                self.agent.release_xfer_handle(h)
            except Exception as exc:  # noqa: BLE001
                log.debug("release_xfer_handle: %s", exc)
        filler.release(buf)

    def close(self) -> None:
        pass
