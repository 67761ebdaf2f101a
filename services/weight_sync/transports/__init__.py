"""Weight data planes: the sending half (imported by the trainer) and receiving half (imported by rollout).

Transports: "bucketed" (gRPC stream), "broadcast" (gloo/NCCL group, gRPC stream for replicas outside it), "nixl"
(P2P WRITEs into registered replica memory), "disk_delta" (changed elements in files). `get_receiver(name)` gives
the stateless fetch of "bucketed"; the others keep state on the replica (a group membership, a registered agent,
the held weights) and are built by services.rollout.weight_updates.TransportReceivers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlfleet.v1 import weights_pb2
from services.weight_sync.transports.errors import WeightTransferError

# fetch(manifest, token, timeout, replica_id) -> [(name, tensor)] in manifest order; raises WeightTransferError
Receiver = Callable[[weights_pb2.WeightManifest, str | None, float, str], list[tuple[str, torch.Tensor]]]

KNOWN = ("bucketed", "broadcast", "nixl", "disk_delta")
STATEFUL = ("broadcast", "nixl", "disk_delta")


def get_receiver(name: str) -> Receiver:
    """The fetch function of a stateless transport; ValueError for one this build does not have or that needs state."""
    if name == "bucketed":
        from services.weight_sync.transports.bucketed import fetch

        return fetch
    if name in STATEFUL:
        raise ValueError(f"weight transport '{name}' needs a replica-side receiver "
                         "(services.rollout.weight_updates.TransportReceivers)")
    raise ValueError(f"unknown weight transport '{name}' (available: {', '.join(KNOWN)})")


__all__ = ["KNOWN", "STATEFUL", "Receiver", "WeightTransferError", "get_receiver"]
