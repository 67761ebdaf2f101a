"""Receive side of NIXL P2P: a replica registers staging memory for its weights and waits for the trainer's WRITEs.

Two staging slots of `capacity_bytes` each are registered with a UCX agent; the agent metadata, base address and
slot size go to the control plane (WeightSync.Register). The trainer writes version v into slot v % 2 and then
sends the notification `rlfleet:<version>:<digest>`. `fetch` waits for that notification, checks every tensor's hash
in the slot against the manifest and returns views of it (the caller loads them into the engine at once). No
notification within the timeout (a trainer rank died mid-transfer) means nothing is returned: the previous version
keeps serving. The staging copy is what keeps a half-written version away from the engine.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch

from rlfleet.security.identity import Credential
from rlfleet.services.weight_sync.transports.bucketed.receiver import unpack
from rlfleet.services.weight_sync.transports.errors import WeightTransferError
from rlfleet.services.weight_sync.transports.layout import checked_layout
from rlfleet.services.weight_sync.transports.nixl.agent import TRANSPORT, device_id, done_message, make_agent, mem_type
from rlfleet.v1 import weight_sync_pb2, weights_pb2

log = logging.getLogger(__name__)

SLOTS = 2


class NixlReceiver:
    def __init__(self, replica_id: str, capacity_bytes: int, register: Callable[[weight_sync_pb2.PeerInfo], None],
                 device: torch.device | str = "cpu") -> None:
        self.replica_id = replica_id
        self.capacity = int(capacity_bytes)
        self.staging = torch.zeros(SLOTS * self.capacity, dtype=torch.uint8, device=device)   # [slots * capacity]
        self.agent = make_agent(f"replica-{replica_id}")
        self.agent.register_memory([self.staging])
        self._lock = threading.Lock()
        self._notifs: set[bytes] = set()
        register(weight_sync_pb2.PeerInfo(
            peer_id=replica_id, transport=TRANSPORT, agent_metadata=self.agent.get_agent_metadata(),
            agent_name=self.agent.name, base_address=self.staging.data_ptr(), capacity_bytes=self.capacity,
            slots=SLOTS, device_id=device_id(self.staging), mem_type=mem_type(self.staging)))
        log.info("NIXL agent %s registered %d x %d bytes of %s staging", self.agent.name, SLOTS, self.capacity,
                 mem_type(self.staging))

    def _seen(self, message: bytes) -> bool:
        with self._lock:
            for msgs in self.agent.get_new_notifs().values():
                self._notifs.update(msgs)
            if message in self._notifs:
                self._notifs.discard(message)
                return True
            return False

    def fetch(self, manifest: weights_pb2.WeightManifest, token: Credential, timeout: float,
              replica_id: str = "") -> list[tuple[str, torch.Tensor]]:
        version = manifest.version
        layout = checked_layout(manifest, TRANSPORT)
        if layout.total_bytes > self.capacity:
            raise WeightTransferError(version, f"{layout.total_bytes} bytes do not fit the {self.capacity}-byte "
                                               "staging slot this replica registered")
        message = done_message(version, manifest.digest)
        deadline = time.monotonic() + timeout
        while not self._seen(message):
            if time.monotonic() > deadline:
                raise WeightTransferError(version, f"no NIXL completion notification within {timeout:.1f}s: the "
                                                   "trainer peer died or stalled mid-transfer; nothing was applied")
            time.sleep(0.001)
        start = (version % SLOTS) * self.capacity
        flat = self.staging[start:start + layout.total_bytes]
        if flat.device.type != "cpu":
            flat = flat.cpu()
        return unpack(manifest, layout, flat)

    def close(self) -> None:
        try:
            self.agent.deregister_memory(self.agent.get_reg_descs([self.staging]))
        except Exception as exc:  # noqa: BLE001 - best effort at shutdown
            log.debug("NIXL deregister: %s", exc)
