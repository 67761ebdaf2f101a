"""The disk-delta transport: each version written as the changed elements against the last (codec.py, files.py);
a replica rebuilds it from the weights it holds (receiver.py)."""

from __future__ import annotations

from rlfleet.services.weight_sync.transports.contract import (
    AutoCandidate,
    Receiver,
    ReceiverSetup,
    Sender,
    SenderSetup,
    Transport,
)
from rlfleet.services.weight_sync.transports.disk_delta.probe import probe_delta


def make_sender(setup: SenderSetup) -> Sender:
    from rlfleet.services.weight_sync.transports.disk_delta.sender import DeltaSender

    return DeltaSender(setup.delta_root, setup.delta_encoding, setup.rebase_every)


def make_receiver(setup: ReceiverSetup) -> Receiver:
    from rlfleet.services.weight_sync.transports.disk_delta.receiver import DeltaReceiver

    holder = setup.holder
    return DeltaReceiver(lambda: (holder.weight_version, dict(holder.named_weights())))


# auto: moves a fraction of the bytes (bf16 at small lr: ~1-15% change; 15% conservatively) but pays for the diff,
# zstd and two file passes
TRANSPORT = Transport("disk_delta", make_sender, make_receiver,
                      auto=AutoCandidate(fixed_seconds=0.2, probe=probe_delta, bytes_fraction=0.15))
