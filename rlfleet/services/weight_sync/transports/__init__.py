"""The weight transport library: the data planes that move weights from the trainer to the rollout replicas.

This is a library, not part of the weight_sync service: the sending halves run inside the trainer's processes
(rlfleet/services/trainer/publisher.py) and the receiving halves inside each rollout replica
(rlfleet/services/rollout/weight_updates.py); the weight_sync service itself
(rlfleet/services/weight_sync/servicer.py, board.py)
only carries manifests, acknowledgements and the peer directory. It is the one package that other services may
import from rlfleet/services/weight_sync (tests/unit/test_import_directions.py holds that).

contract.py: the `Sender` / `Receiver` Protocols, the `WeightHolder` a receiver reads, the setups factories get,
and the `Transport` record (with its `AutoCandidate`: what `transport: auto` weighs).
registry.py: `TRANSPORTS` and `transport(name)`, the one lookup both sides use.
One package per transport: bucketed/ (gRPC stream), broadcast/ (gloo/NCCL group, gRPC fallback), nixl/ (P2P
WRITEs into registered replica memory), disk_delta/ (changed elements in files). Shared pieces: manifest.py
(checksums, digests), layout.py (bucket plans), fill.py, planned.py, sharded.py, peers.py (control-plane client),
errors.py, auto.py (`transport: auto`), probe.py (the copy-rate probes auto runs; nixl/ and disk_delta/ have their
own probe.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlfleet.services.weight_sync.transports.errors import WeightTransferError

if TYPE_CHECKING:       # contract.py imports torch: the weight_sync service, which imports manifest.py, does not
    from rlfleet.services.weight_sync.transports.contract import Fetch


def get_receiver(name: str) -> Fetch:
    """The receiver of a stateless transport (one any process can build without setup); ValueError for an unknown
    transport or one that keeps state on the replica (built once by rlfleet.services.rollout.weight_updates)."""
    from rlfleet.services.weight_sync.transports.registry import transport

    fetch = transport(name).fetch
    if fetch is None:
        raise ValueError(f"weight transport '{name}' needs a replica-side receiver "
                         "(rlfleet.services.rollout.weight_updates.TransportReceivers)")
    return fetch


__all__ = ["WeightTransferError", "get_receiver"]
