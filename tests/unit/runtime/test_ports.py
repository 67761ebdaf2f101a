"""Ports for local services are chosen below the kernel's ephemeral range, so that no outgoing connection of the
run itself can take one between the choice and the service's bind (seen as "Address already in use" in a trainer
started beside three other services)."""

from __future__ import annotations

import socket
from pathlib import Path

from rlfleet.runtime.ports import free_ports


def _ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    ports = free_ports(12)
    assert len(set(ports)) == 12
    assert all(10_000 <= p < _ephemeral_low() for p in ports)
    held = []
    try:
        for p in ports:                          # each is free: binding it by number works
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", p))
            held.append(s)
    finally:
        for s in held:
            s.close()


def test_an_outgoing_connection_never_lands_on_a_chosen_port() -> None:
    """The local port of a connection comes from the ephemeral range: dial a listener many times and none of the
    client ports is below it."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    clients = []
    try:
        for _ in range(50):
            c = socket.create_connection(listener.getsockname())
            clients.append(c)
        assert min(c.getsockname()[1] for c in clients) >= _ephemeral_low()
    finally:
        for c in clients:
            c.close()
        listener.close()
