"""Free loopback ports for a local run (and for tests that start services on loopback).

Ports are chosen below the kernel's ephemeral range. A port handed out by bind(0) comes from that range, and so
does the local port of every outgoing connection: between choosing a port and the service binding it, one of the
run's own connections (a replica dialling the buffer, say) could take it, and the service would fail with "Address
already in use". A port below the range is never given to an outgoing connection, so it stays free until a program
asks for it by number.
"""

from __future__ import annotations

import itertools
import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000                  # below: well-known and registered services people run by number
DEFAULT_EPHEMERAL_LOW = 32_768   # Linux's default start of the range (macOS and BSD start at 49152)


def ephemeral_low() -> int:
    """The first port of the ephemeral range (Linux: /proc; elsewhere the Linux default, below the BSD one)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct ports below the ephemeral range that were free a moment ago (every socket is held open until all
    n are chosen). Falls back to bind(0) when the range leaves too little room below it."""
    low = ephemeral_low()
    start = random.randrange(LOWEST, low) if low > LOWEST else LOWEST   # not seeded: runs starting at once differ
    candidates = itertools.chain(range(start, low), range(LOWEST, start))
    socks: list[socket.socket] = []
    try:
        for port in candidates:
            if len(socks) == n:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        while len(socks) < n:           # no room below the range: what the kernel hands out
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]
