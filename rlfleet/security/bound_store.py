"""A torch TCPStore master that listens on the interface it is given only.

`dist.TCPStore(host, port, is_master=True)` listens on every interface whatever host says; here the listening
socket is made and bound by us and handed over (`master_listen_fd`), so a rendezvous on 127.0.0.1 is not reachable
from the network and one on a pod IP is not reachable on other interfaces.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch.distributed as dist


def bound_socket(host: str, port: int) -> socket.socket:
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(addr)
    sock.listen(512)
    return sock


def bound_tcp_store(host: str, port: int, timeout: timedelta, wait_for_workers: bool = False) -> dist.TCPStore:
    """The master TCPStore on host:port (port 0: a free one; `.port` tells which) listening on that host only."""
    sock = bound_socket(host, port)
    actual = sock.getsockname()[1]
    # the store owns the descriptor from here on (detach: Python must not close it under the store's daemon)
    return dist.TCPStore(host, actual, None, True, timeout, wait_for_workers=wait_for_workers,
                         master_listen_fd=sock.detach(), use_libuv=False)
