"""The rendezvous stores of the trainer ranks' process group and of SGLang's weight group listen on their host only
(rlfleet/security/bound_store.py: torch's own TCPStore master listens on every interface whatever host it is given),
and fall back to every interface, warned, only when that host is not this machine's. Checked on the real listening
sockets of this process (psutil) and with a real client store."""

from __future__ import annotations

import logging
from datetime import timedelta

import psutil
import pytest

from rlfleet.runtime.ports import free_port
from rlfleet.security.bound_store import POD_IP_ENV, rendezvous_store

TIMEOUT = timedelta(seconds=20)


def _listening_ips(port: int) -> set[str]:
    return {c.laddr.ip for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def test_rank_0_listens_on_the_rendezvous_host_only_and_the_other_ranks_reach_it() -> None:
    port = free_port("127.0.0.1")
    master = rendezvous_store("127.0.0.1", port, 0, 2, TIMEOUT)
    assert _listening_ips(port) == {"127.0.0.1"}
    client = rendezvous_store("127.0.0.1", port, 1, 2, TIMEOUT)
    client.set("hello", "from rank 1")
    assert master.get("hello") == b"from rank 1"


def test_a_rendezvous_name_not_resolvable_here_binds_the_pod_ip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POD_IP_ENV, "127.0.0.1")
    port = free_port("127.0.0.1")
    master = rendezvous_store("rank-0.not-yet-in-dns.invalid", port, 0, 2, TIMEOUT)
    assert _listening_ips(port) == {"127.0.0.1"}
    master.set("k", "v")


def test_sglang_groups_bind_the_address_they_are_given_not_the_pod_ip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(POD_IP_ENV, "192.0.2.7")          # the server connects to the address it was told
    port = free_port("127.0.0.1")
    master = rendezvous_store("127.0.0.1", port, 0, 2, TIMEOUT, bind="127.0.0.1")
    assert _listening_ips(port) == {"127.0.0.1"}
    master.set("k", "v")


def test_a_host_of_another_machine_falls_back_to_every_interface_and_says_so(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv(POD_IP_ENV, raising=False)
    port = free_port("127.0.0.1")
    with caplog.at_level(logging.WARNING, logger="rlfleet.security.bound_store"):
        master = rendezvous_store("192.0.2.7", port, 0, 2, TIMEOUT)       # TEST-NET-1: never this machine's
    assert _listening_ips(port) <= {"0.0.0.0", "::"} and _listening_ips(port)
    assert "listening on every interface" in caplog.text and "NetworkPolicy" in caplog.text
    client = rendezvous_store("127.0.0.1", port, 1, 2, TIMEOUT)
    client.set("k", "v")
    assert master.get("k") == b"v"
