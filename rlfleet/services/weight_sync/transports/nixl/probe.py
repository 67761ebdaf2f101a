"""`transport: auto`'s probe of the NIXL transport: one WRITE between two in-process agents (needs nixl)."""

from __future__ import annotations

import time

import torch

from rlfleet.services.weight_sync.transports.probe import PROBE_BYTES, gbps


def probe_nixl(nbytes: int = PROBE_BYTES) -> float:
    from rlfleet.services.weight_sync.transports.nixl.agent import make_agent, wait_xfer

    src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.zeros(nbytes, dtype=torch.uint8)
    a, b = make_agent("probe-a"), make_agent("probe-b")
    a.register_memory([src])
    b.register_memory([dst])
    a.add_remote_agent(b.get_agent_metadata())
    remote = a.deserialize_descs(b.get_serialized_descs(b.get_xfer_descs([dst])))

    def once() -> None:
        h = a.initialize_xfer("WRITE", a.get_xfer_descs([src]), remote, b.name)
        a.transfer(h)
        if wait_xfer(a, h, time.monotonic() + 30) != "DONE":
            raise RuntimeError("NIXL probe transfer failed")
        a.release_xfer_handle(h)

    return gbps(once, nbytes)


def nixl_missing() -> str | None:
    """None when nixl imports here, else why not (then auto does not consider the transport)."""
    from rlfleet.services.weight_sync.transports.nixl.agent import available

    return available()
