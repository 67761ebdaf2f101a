"""Weight data planes: the sending half (imported by the trainer) and receiving half (imported by rollout).

`get_receiver(manifest.transport)` gives the function a replica calls to fetch a published version.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlfleet.v1 import weights_pb2
from services.weight_sync.transports.errors import WeightTransferError

# fetch(manifest, token, timeout, replica_id) -> [(name, tensor)] in manifest order; raises WeightTransferError
Receiver = Callable[[weights_pb2.WeightManifest, str | None, float, str], list[tuple[str, torch.Tensor]]]

KNOWN = ("bucketed",)   # later: "nixl", "disk_delta"


def get_receiver(name: str) -> Receiver:
    """The fetch function of transport `name`; ValueError for a transport this build does not have."""
    if name == "bucketed":
        from services.weight_sync.transports.bucketed import fetch

        return fetch
    raise ValueError(f"unknown weight transport '{name}' (available: {', '.join(KNOWN)})")


__all__ = ["KNOWN", "Receiver", "WeightTransferError", "get_receiver"]
