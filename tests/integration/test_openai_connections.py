"""How the replica's OpenAI endpoint and the run's gateway take connections: a burst of new connections (an agent
starting a claim's episodes at once) is accepted by the kernel without dropped SYNs, and over TLS a peer that connects
and never speaks neither blocks other clients nor holds its connection past the handshake deadline."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest

from rlfleet.security.pki import CA_CERT, cert_paths, create_run_pki
from rlfleet.services.rollout.openai_api.app import OpenAIApp
from rlfleet.services.rollout.openai_api.background import BackgroundHTTP
from rlfleet.services.rollout.openai_api.gateway import OpenAIGateway, Routes
from rlfleet.services.rollout.openai_api.server import OpenAIServer
from tests.support.calculator_app import calculator_app

KEY = "connections-key"
BURST = 64          # more than a claim's episodes (claim_groups x group_size = 32 in the calculator example)


@pytest.fixture(scope="module")
def app() -> Iterator[OpenAIApp]:
    yield from calculator_app()


def _replica(app: OpenAIApp) -> BackgroundHTTP:
    return OpenAIServer(app, api_key=KEY, replica_id="rollout-0")


def _gateway(app: OpenAIApp) -> BackgroundHTTP:
    return OpenAIGateway(Routes(lambda: {}), api_key=KEY)


@pytest.mark.parametrize("make", [_replica, _gateway], ids=["replica", "gateway"])
def test_a_burst_of_connections_is_accepted_while_the_server_is_busy(app: OpenAIApp, make: Any) -> None:
    """Not started, the server accepts nothing: every connection the kernel completes waits in the listen backlog.
    All BURST connect within the deadline; a backlog of the stdlib's 5 drops the 7th SYN, and the kernel resends a
    dropped SYN only after 1 s, then 3 s, 7 s: an openai client (5 s connect timeout) fails the request."""
    server = make(app)
    conns: list[socket.socket] = []
    try:
        for i in range(BURST):
            try:
                conns.append(socket.create_connection(("127.0.0.1", server.port), timeout=0.8))
            except TimeoutError:
                pytest.fail(f"connection {i + 1} of {BURST} was not accepted into the listen backlog")
        assert len(conns) == BURST
    finally:
        for c in conns:
            c.close()
        server.stop()                                    # never started: stop() must not wait for it


def test_a_silent_tls_peer_blocks_no_one_and_is_dropped(app: OpenAIApp, tmp_path: Path) -> None:
    pki = create_run_pki(tmp_path / "pki", [("rollout", "rollout-0")])
    trust = ssl.create_default_context(cafile=str(pki / CA_CERT))
    replica = OpenAIServer(app, api_key=KEY, replica_id="rollout-0", tls=cert_paths(pki, "rollout-0"),
                           handshake_seconds=1.0).start()
    silent = socket.create_connection(("127.0.0.1", replica.port), timeout=30)        # connects, never says hello
    try:
        time.sleep(0.2)                                                                # accepted before the client
        with httpx.Client(verify=trust, timeout=httpx.Timeout(5.0)) as http, \
                openai.OpenAI(base_url=replica.base_url, api_key=KEY, http_client=cast(Any, http),
                              max_retries=0) as client:
            assert [m.id for m in client.models.list()] == [app.settings.model_name]
        started = time.monotonic()
        assert silent.recv(1) == b""                     # the server hung up on it: its handshake deadline passed
        assert time.monotonic() - started < 10
    finally:
        silent.close()                                   # first: a server stuck in its handshake cannot stop
        replica.stop()
