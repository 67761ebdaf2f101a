"""The disk-delta transport: each version written as the changed elements against the last (codec.py, files.py);
a replica rebuilds it from the weights it holds (receiver.py)."""

from __future__ import annotations

from rlfleet.services.weight_sync.transports.contract import Receiver, ReceiverSetup, Sender, SenderSetup, Transport


def make_sender(setup: SenderSetup) -> Sender:
    from rlfleet.services.weight_sync.transports.disk_delta.sender import DeltaSender

    return DeltaSender(setup.delta_root, setup.delta_encoding, setup.rebase_every)


def make_receiver(setup: ReceiverSetup) -> Receiver:
    from rlfleet.services.weight_sync.transports.disk_delta.receiver import DeltaReceiver

    holder = setup.holder
    return DeltaReceiver(lambda: (holder.weight_version, dict(holder.named_weights())))


TRANSPORT = Transport("disk_delta", make_sender, make_receiver)
