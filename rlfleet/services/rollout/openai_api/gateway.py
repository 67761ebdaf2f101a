"""One OpenAI entry point for callers outside the run loop (an agent service, evaluation, a benchmark): each request
goes to a replica's endpoint, every request of a session to the same one, chosen by rlfleet/services/rollout/router.py
(rendezvous hashing on the X-Session-Id header, least-loaded without a session), with each replica's health read
from its endpoint's /health.

The replicas are whatever RUN_DIR/openai/*.json lists now (each replica writes its file when its endpoint starts and
removes it when it stops), so replicas added by `rlfleet scale` are routed to as they come. A replica that refuses
the connection is marked down and the request is sent to the next; the answer (JSON or SSE) is relayed as it comes.
The gateway checks the API key itself and passes it on (every replica of a run has the same key). `rlfleet run`
starts it as a process of the run (`python -m rlfleet.services.rollout.openai_api`,
rlfleet/services/rollout/openai_api/__main__.py).

Inside the run, a rollout function talks to its own replica's endpoint directly (rlfleet/services/rollout/openai_api/
endpoint.py): its sessions must be recorded where it turns them into samples.
"""

from __future__ import annotations

import hmac
import http.client
import json
import logging
import ssl
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rlfleet.services.rollout.openai_api.background import BackgroundHTTP, ThreadedHTTPServer
from rlfleet.services.rollout.openai_api.server import MAX_BODY_BYTES, SESSION_HEADER
from rlfleet.services.rollout.openai_api.wire import error_body
from rlfleet.services.rollout.router import NoHealthyReplica, ReplicaRouter

log = logging.getLogger(__name__)

RELAY_CHUNK = 64 * 1024


def replicas_in(folder: Path) -> dict[str, str]:
    """{gRPC endpoint: OpenAI base_url} of the replicas that have written their address file in `folder`."""
    out: dict[str, str] = {}
    for path in sorted(Path(folder).glob("*.json")):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue                                  # being written or removed
        if isinstance(entry, dict) and entry.get("rollout") and entry.get("base_url"):
            out[str(entry["rollout"])] = str(entry["base_url"])
    return out


def http_healthy(base_url: str, tls: ssl.SSLContext | None = None, timeout: float = 1.0) -> bool:
    """The replica's endpoint answers GET /health with 200 (its engine serves)."""
    url = urlsplit(base_url)
    conn = (http.client.HTTPSConnection(url.hostname or "", url.port, timeout=timeout, context=tls)
            if url.scheme == "https" else http.client.HTTPConnection(url.hostname or "", url.port, timeout=timeout))
    try:
        conn.request("GET", url.path.removesuffix("/v1") + "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


RouterFactory = Callable[[list[str], Mapping[str, str]], ReplicaRouter]


def http_router(tls: ssl.SSLContext | None = None) -> RouterFactory:
    """A router over the replicas' gRPC endpoints whose health check is their OpenAI endpoint's /health (the
    gateway holds no gRPC credential: it never calls the replicas' gRPC services)."""
    def make(endpoints: list[str], urls: Mapping[str, str]) -> ReplicaRouter:
        return ReplicaRouter(endpoints, None, health=lambda e: http_healthy(urls[e], tls))
    return make


class Routes:
    """The current router over the current replicas; rebuilt when the set of replicas changes. Thread-safe."""

    def __init__(self, replicas: Callable[[], Mapping[str, str]], make_router: RouterFactory | None = None) -> None:
        self._replicas = replicas
        self._make = make_router or http_router()
        self._lock = threading.Lock()
        self._urls: dict[str, str] = {}
        self._router: ReplicaRouter | None = None

    def current(self) -> tuple[ReplicaRouter, dict[str, str]]:
        urls = dict(self._replicas())
        with self._lock:
            if urls != self._urls or self._router is None:
                if not urls:
                    raise NoHealthyReplica("no rollout replica serves the OpenAI endpoint yet")
                old, self._router, self._urls = self._router, self._make(sorted(urls), urls), urls
                if old is not None:
                    old.close()
            return self._router, self._urls

    def close(self) -> None:
        with self._lock:
            if self._router is not None:
                self._router.close()
                self._router = None


class _GatewayServer(ThreadedHTTPServer):
    def __init__(self, address: tuple[str, int], routes: Routes, api_key: str | None,
                 tls: ssl.SSLContext | None) -> None:
        super().__init__(address, _GatewayHandler)
        self.routes, self.api_key, self.tls = routes, api_key, tls


class _GatewayHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True        # headers and body are two writes: no 40 ms delayed-ACK stall
    server: _GatewayServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _error(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> None:
        data = json.dumps(error_body(message, kind, code)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._relay(b"")

    def do_DELETE(self) -> None:
        self._relay(b"")

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            self.close_connection = True
            self._error(413, f"request body must be 0..{MAX_BODY_BYTES} bytes")
            return
        self._relay(self.rfile.read(length))

    def _relay(self, body: bytes) -> None:
        key = self.server.api_key
        if key is not None and not hmac.compare_digest(self.headers.get("Authorization", "").encode(),
                                                       f"Bearer {key}".encode()):
            self._error(401, "missing or wrong API key", "authentication_error", "invalid_api_key")
            return
        session = self.headers.get(SESSION_HEADER) or None
        tried: list[str] = []
        while True:
            try:
                router, urls = self.server.routes.current()
                endpoint = router.pick(session, exclude=tried)
            except NoHealthyReplica as exc:
                self._error(503, str(exc), "server_error", "no_replica")
                return
            try:
                upstream = self._open(urls[endpoint], body)
            except OSError as exc:
                log.warning("gateway: replica %s unreachable (%s); marking it down", endpoint, exc)
                router.mark_down(endpoint)
                tried.append(endpoint)
                continue
            self._pass_back(upstream)
            return

    def _open(self, base_url: str, body: bytes) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        url = urlsplit(base_url)
        conn: http.client.HTTPConnection
        if url.scheme == "https":
            conn = http.client.HTTPSConnection(url.hostname or "", url.port, timeout=3600,
                                               context=self.server.tls)
        else:
            conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=3600)
        path = url.path.removesuffix("/v1") + self.path
        headers = {k: v for k, v in self.headers.items() if k.lower() in
                   ("authorization", "content-type", "accept", SESSION_HEADER.lower())}
        headers["Content-Length"] = str(len(body))
        try:
            conn.request(self.command, path, body=body if body else None, headers=headers)
            return conn, conn.getresponse()
        except OSError:
            conn.close()
            raise

    def _pass_back(self, upstream: tuple[http.client.HTTPConnection, http.client.HTTPResponse]) -> None:
        conn, resp = upstream
        try:
            self.send_response(resp.status)
            length = resp.getheader("Content-Length")
            for name, value in resp.getheaders():
                if name.lower() not in ("connection", "transfer-encoding", "date", "server"):
                    self.send_header(name, value)
            if length is None:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            while chunk := resp.read1(RELAY_CHUNK):
                self.wfile.write(chunk)
                self.wfile.flush()
        finally:
            conn.close()


class OpenAIGateway(BackgroundHTTP):
    """Serve the gateway on host:port (0: a free port) in a background thread."""

    def __init__(self, routes: Routes, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        """tls: how to verify replicas that speak HTTPS (a context trusting the run CA)."""
        self.routes = routes
        super().__init__(_GatewayServer((host, port), routes, api_key, tls), host, "http", "openai-gateway")

    def stop(self) -> None:
        super().stop()
        self.routes.close()
