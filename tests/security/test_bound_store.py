"""The broadcast rendezvous store listens on the interface it was given only (torch's own listens on all)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from rlfleet.security.bound_store import bound_tcp_store


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} writes them) of sockets listening on `port`."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            addr, hexport = fields[1].rsplit(":", 1)
            if int(hexport, 16) == port and fields[3] == "0A":          # 0A: LISTEN
                out.append(addr)
    return out


def test_store_listens_on_loopback_only_and_serves() -> None:
    store = bound_tcp_store("127.0.0.1", 0, timedelta(seconds=10))
    assert _listening(store.port) == ["0100007F"]                       # 127.0.0.1, not 0.0.0.0 or ::
    client = dist.TCPStore("127.0.0.1", store.port, None, False, timedelta(seconds=10))
    client.set("rendezvous", "ok")
    assert store.get("rendezvous") == b"ok" and int(store.add("joined", 1)) == 1
