"""What one client may hold of the replica's OpenAI endpoint and the run's gateway (issue 40 item 7), on real
servers over loopback sockets: a client that sends nothing or half a request is dropped after the header deadline,
connections past the cap are refused at once (503) rather than each held on a thread, a request without a valid key
is answered 401 before its body is sent, a body nested too deeply for the JSON parser is a 400 that leaves the
replica routed, and a session is visible only to the key that opened it."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from rlfleet.services.rollout.openai_api.app import OpenAIApp
from rlfleet.services.rollout.openai_api.background import BackgroundHTTP
from rlfleet.services.rollout.openai_api.gateway import OpenAIGateway, Routes, replicas_in
from rlfleet.services.rollout.openai_api.server import SESSION_HEADER, OpenAIServer
from tests.support.calculator_app import calculator_app

torch.set_num_threads(1)
KEY, OTHER = "limits-key", "other-tenant-key"
MESSAGES: list[Any] = [{"role": "user", "content": "1+1="}]


@pytest.fixture(scope="module")
def app() -> Iterator[OpenAIApp]:
    yield from calculator_app()


@pytest.fixture
def pair(app: OpenAIApp, tmp_path: Path) -> Iterator[tuple[OpenAIServer, OpenAIGateway]]:
    """A replica endpoint and a gateway in front of it (listed the way a replica lists itself)."""
    replica = OpenAIServer(app, api_key=[KEY, OTHER], replica_id="rollout-0").start()
    (tmp_path / "rollout-0.json").write_text(json.dumps({"replica_id": "rollout-0", "base_url": replica.base_url,
                                                          "rollout": "grpc-rollout-0:1"}))
    gateway = OpenAIGateway(Routes(lambda: replicas_in(tmp_path)), api_key=[KEY, OTHER]).start()
    yield replica, gateway
    gateway.stop()
    replica.stop()


def _server(pair: tuple[OpenAIServer, OpenAIGateway], which: str) -> BackgroundHTTP:
    return pair[0] if which == "replica" else pair[1]


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server ends the connection (EOF or reset) within `seconds`, reading whatever it sends first."""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def _status_line(sock: socket.socket, seconds: float) -> bytes:
    sock.settimeout(seconds)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.parametrize("which", ["replica", "gateway"])
def test_a_client_that_sends_nothing_or_half_a_request_is_dropped(pair: Any, which: str) -> None:
    server = _server(pair, which)
    server._http.header_seconds = 1.0                       # type: ignore[attr-defined]
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    dripping = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    stop = threading.Event()

    def drip() -> None:                                     # a byte every 0.2 s: never idle long, never done
        for byte in b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 200:
            if stop.wait(0.2):
                return
            try:
                dripping.send(bytes([byte]))
            except OSError:
                return

    t = threading.Thread(target=drip, daemon=True)
    t.start()
    try:
        assert _closed_within(silent, 15.0), "a connection that sent nothing was kept"
        assert _closed_within(dripping, 15.0), "a request sent a byte at a time was kept"
    finally:
        stop.set()
        t.join(5)
        silent.close()
        dripping.close()


@pytest.mark.parametrize("which", ["replica", "gateway"])
def test_connections_past_the_cap_are_refused_at_once_and_slots_come_back(app: OpenAIApp, tmp_path: Path,
                                                                          which: str) -> None:
    cap = 4
    if which == "replica":
        server: BackgroundHTTP = OpenAIServer(app, api_key=KEY, max_connections=cap).start()
    else:
        server = OpenAIGateway(Routes(lambda: {}), api_key=KEY, max_connections=cap).start()
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(cap)]
    try:
        # the server takes the held ones as its accept loop reaches them; then every further one is refused
        deadline = time.monotonic() + 10
        while not _refused(server) and time.monotonic() < deadline:
            pass
        threads = threading.active_count()
        assert all(_refused(server) for _ in range(20)), "a connection past the cap was served"
        assert threading.active_count() <= threads, "a refused connection got a thread"
    finally:
        for s in held:
            s.close()
    try:                                     # closed, the held connections give their slots back
        deadline = time.monotonic() + 10
        while _refused(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        r = httpx.get(server.base_url + "/models", headers={"Authorization": f"Bearer {KEY}"})
        assert r.json()["error"]["code"] == "no_replica" if which == "gateway" else r.status_code == 200
    finally:
        server.stop()


def _refused(server: BackgroundHTTP) -> bool:
    """A request on a new connection is not served: answered 503 too_many_connections (or, when the server's close
    overtakes the answer, reset)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        resp = conn.getresponse()
        body = resp.read()
    except (ConnectionResetError, BrokenPipeError):
        return True
    finally:
        conn.close()
    return resp.status == 503 and b"too_many_connections" in body


@pytest.mark.parametrize("which", ["replica", "gateway"])
def test_a_request_without_the_key_is_answered_before_its_body_is_sent(pair: Any, which: str) -> None:
    """The headers announce 8 MiB and no body byte is sent: the 401 comes at once and the connection closes."""
    server = _server(pair, which)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
                     b"Content-Type: application/json\r\nContent-Length: " + str(8 * 2**20).encode() + b"\r\n\r\n")
        head = _status_line(sock, 5.0)
        assert head.startswith(b"HTTP/1.1 401"), head
        assert b"connection: close" in head.lower()
        assert _closed_within(sock, 5.0)
    finally:
        sock.close()


def test_a_deeply_nested_body_is_a_400_and_the_replica_stays_routed(pair: Any) -> None:
    replica, gateway = pair
    nested = b"[" * 200_000 + b"]" * 200_000
    for server in (replica, gateway):
        r = httpx.post(server.base_url + "/chat/completions", content=nested, timeout=30,
                       headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        assert "nests too deeply" in r.json()["error"]["message"]
    # the gateway did not take the replica out of its routing: the next request is served at once
    client = openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0)
    done = client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
    assert done.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("which", ["replica", "gateway"])
def test_a_session_is_seen_and_touched_only_under_the_key_that_opened_it(pair: Any, which: str) -> None:
    server = _server(pair, which)
    sid = f"tenant-a-{which}"
    owner = openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0)
    intruder = openai.OpenAI(base_url=server.base_url, api_key=OTHER, max_retries=0)
    first = owner.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2,
                                          extra_headers={SESSION_HEADER: sid})
    url = f"{server.base_url}/sessions/{sid}"
    assert httpx.get(url, headers={"Authorization": f"Bearer {OTHER}"}).status_code == 404
    assert httpx.delete(url, headers={"Authorization": f"Bearer {OTHER}"}).status_code == 404
    reply: Any = {"role": "assistant", "content": first.choices[0].message.content or ""}
    with pytest.raises(openai.NotFoundError):
        intruder.chat.completions.create(model="m", messages=[*MESSAGES, reply, *MESSAGES],
                                         max_tokens=2, extra_headers={SESSION_HEADER: sid})
    record = httpx.get(url, headers={"Authorization": f"Bearer {KEY}"})
    assert record.status_code == 200
    assert record.json()["turns"] == 1                      # the intruder's request added nothing
    assert httpx.delete(url, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert httpx.get(url, headers={"Authorization": f"Bearer {KEY}"}).status_code == 404


@pytest.mark.parametrize("which", ["replica", "gateway"])
def test_expect_100_continue_goes_on_only_with_the_key(pair: Any, which: str) -> None:
    """curl sends `Expect: 100-continue` before a large body: a wrong key gets the 401 instead of the go-ahead."""
    server = _server(pair, which)
    body = json.dumps({"model": "m", "messages": MESSAGES, "max_tokens": 2}).encode()
    for key, first in (("wrong", b"HTTP/1.1 401"), (KEY, b"HTTP/1.1 100")):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode()
                         + b"\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n")
            head = _status_line(sock, 10.0)
            assert head.startswith(first), head
            if key == KEY:
                sock.sendall(body)
                assert _status_line(sock, 30.0).startswith(b"HTTP/1.1 200")
