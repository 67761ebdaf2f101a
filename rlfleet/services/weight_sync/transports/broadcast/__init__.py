"""The broadcast transport: buckets broadcast over a gloo/NCCL group the replicas join (broadcast/group.py), with
the bucketed gRPC stream as the fallback for replicas outside the group (sender.py, receiver.py, wire.py)."""

from __future__ import annotations

from rlfleet.services.weight_sync.transports.contract import (
    AutoCandidate,
    Receiver,
    ReceiverSetup,
    Sender,
    SenderSetup,
    Transport,
)
from rlfleet.services.weight_sync.transports.probe import probe_memcpy


def make_sender(setup: SenderSetup) -> Sender:
    from rlfleet.services.weight_sync.transports.broadcast.sender import BroadcastSender
    from rlfleet.services.weight_sync.transports.bucketed import make_sender as make_stream
    from rlfleet.services.weight_sync.transports.peers import PeerDirectory

    if setup.control is None:
        raise ValueError("the broadcast transport needs the weight_sync control plane (endpoints.weight_sync)")
    host = setup.group_host or setup.endpoint.rpartition(":")[0] or "127.0.0.1"
    return BroadcastSender(make_stream(setup), PeerDirectory(setup.control).register, setup.replicas,
                           rendezvous_host=host, device=setup.device, join_seconds=setup.join_seconds,
                           timeout=setup.timeout, op_timeout=setup.op_timeout)


def make_receiver(setup: ReceiverSetup) -> Receiver:
    from rlfleet.services.weight_sync.transports.broadcast.receiver import BroadcastReceiver
    from rlfleet.services.weight_sync.transports.peers import PeerDirectory

    if setup.control is None:
        raise ValueError("the broadcast transport needs the weight_sync control plane (endpoints.weight_sync)")
    return BroadcastReceiver(PeerDirectory(setup.control).peers, setup.device, setup.join_seconds)


# auto: a collective group to set up per update, then buckets at memory-copy rate
TRANSPORT = Transport("broadcast", make_sender, make_receiver, needs_endpoint=True, needs_control=True,
                      auto=AutoCandidate(fixed_seconds=0.05, probe=probe_memcpy))
