"""The NIXL transport: trainer ranks WRITE buckets into staging memory each replica registered (agent.py holds the
few NIXL calls; sender.py, receiver.py). Importing it needs no nixl; building either half does."""

from __future__ import annotations

from rlfleet.services.weight_sync.transports.contract import (
    AutoCandidate,
    Receiver,
    ReceiverSetup,
    Sender,
    SenderSetup,
    Transport,
)
from rlfleet.services.weight_sync.transports.nixl.probe import nixl_missing, probe_nixl


def make_sender(setup: SenderSetup) -> Sender:
    from rlfleet.services.weight_sync.transports.nixl.sender import NixlSender
    from rlfleet.services.weight_sync.transports.peers import PeerDirectory

    if setup.control is None:
        raise ValueError("the nixl transport needs the weight_sync control plane (endpoints.weight_sync)")
    return NixlSender(PeerDirectory(setup.control).peers, setup.bucket_bytes, setup.rank, setup.world, setup.device,
                      expected_replicas=setup.replicas, wait_seconds=setup.join_seconds, timeout=setup.timeout)


def make_receiver(setup: ReceiverSetup) -> Receiver:
    from rlfleet.services.weight_sync.transports.nixl.receiver import NixlReceiver
    from rlfleet.services.weight_sync.transports.peers import PeerDirectory

    if setup.control is None:
        raise ValueError("the nixl transport needs the weight_sync control plane (endpoints.weight_sync)")
    return NixlReceiver(setup.replica_id, setup.capacity_bytes, PeerDirectory(setup.control).register, setup.device)


# auto: the highest fixed cost (per-bucket descriptors, notifications); a candidate only where nixl imports
TRANSPORT = Transport("nixl", make_sender, make_receiver, needs_control=True, needs_capacity=True,
                      auto=AutoCandidate(fixed_seconds=0.25, probe=probe_nixl, missing=nixl_missing))
