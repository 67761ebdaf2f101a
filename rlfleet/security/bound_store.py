"""A torch TCPStore master that listens on the interface it is given only.

`dist.TCPStore(host, port, is_master=True)` listens on every interface whatever host says; here the listening
socket is made and bound by us and handed over (`master_listen_fd`), so a rendezvous on 127.0.0.1 is not reachable
from the network and one on a pod IP is not reachable on other interfaces.

`rendezvous_store` is the store of a process group's rendezvous (the trainer ranks' group, SGLang's weight group):
rank 0 holds the master, bound like that to the rendezvous host when it is an address of this machine (the
launcher's 127.0.0.1; a pod's own IP, which the chart hands rank 0 as RLFLEET_POD_IP), the other ranks are its
clients. When the host is not this machine's (a name that resolves elsewhere or not yet), the master listens on every
interface as torch's own does, with a warning: then only the network keeps strangers out (the chart's
NetworkPolicy lets trainer ranks and replicas alone reach the trainer's rendezvous port). The store has no
authentication of its own in either case.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta

import torch.distributed as dist

log = logging.getLogger(__name__)

POD_IP_ENV = "RLFLEET_POD_IP"       # the pod's own address (downward API), where rank 0 binds its master


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


def rendezvous_store(host: str, port: int, rank: int, world_size: int, timeout: timedelta,
                     bind: str | None = None) -> dist.TCPStore:
    """The rendezvous store at host:port as rank `rank` sees it: rank 0 the master, listening on `bind` when given,
    else on `host` or RLFLEET_POD_IP, the first that is an address of this machine; when none is, on every
    interface (warned). The other ranks are clients that wait up to `timeout` for it."""
    if rank != 0:
        return dist.TCPStore(host, port, world_size, False, timeout)
    candidates = [bind] if bind else list(dict.fromkeys(h for h in (host, os.environ.get(POD_IP_ENV)) if h))
    failures = []
    for where in candidates:
        try:
            sock = bound_socket(where, port)
        except OSError as exc:                   # not this machine's address, or no such name (yet)
            failures.append(f"{where}: {exc}")
            continue
        # the master's own client connects to where it listens
        return dist.TCPStore(where, port, world_size, True, timeout, wait_for_workers=False,
                             master_listen_fd=sock.detach(), use_libuv=False)
    log.warning("rendezvous %s:%d: cannot listen on its own address only (%s); listening on every interface, as "
                "torch does: only the network (the chart's NetworkPolicy) keeps others from its unauthenticated "
                "store", host, port, "; ".join(failures))
    return dist.TCPStore("127.0.0.1", port, world_size, True, timeout, wait_for_workers=False, use_libuv=False)
