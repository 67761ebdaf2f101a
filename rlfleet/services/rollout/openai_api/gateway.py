"""One OpenAI entry point for callers outside the run loop (an agent service, evaluation, a benchmark): each request
goes to a replica's endpoint, every request of a session to the same one, chosen by rlfleet/services/rollout/router.py
(rendezvous hashing on the X-Session-Id header, least-loaded without a session), with each replica's health read
from its endpoint's /health.

The replicas are whatever RUN_DIR/openai/*.json lists now (each replica writes its file when its endpoint starts and
removes it when it stops), so replicas added by `rlfleet scale` are routed to as they come. A replica that refuses
the connection is marked down and the request is sent to the next; one that takes the request and then fails
(drops the connection without an answer) is answered 502 and keeps its health: whatever a request does to a replica
does not take the replica out of the routing for everyone. The answer (JSON or SSE) is relayed as it comes.
The gateway checks the API key itself, before it reads the body, and passes it on (every replica of a run has the
same keys, and each replica binds sessions to the key). Connections: at most `max_connections` at once, each with
read deadlines (rlfleet/services/rollout/openai_api/guarded.py). `rlfleet run`
starts it as a process of the run (`python -m rlfleet.services.rollout.openai_api`,
rlfleet/services/rollout/openai_api/__main__.py).

Inside the run, a rollout function talks to its own replica's endpoint directly (rlfleet/services/rollout/openai_api/
endpoint.py): its sessions must be recorded where it turns them into samples.
"""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from rlfleet.services.rollout.openai_api.background import MAX_CONNECTIONS, BackgroundHTTP, ThreadedHTTPServer
from rlfleet.services.rollout.openai_api.guarded import GuardedHandler
from rlfleet.services.rollout.openai_api.keys import ApiKeys
from rlfleet.services.rollout.openai_api.server import MAX_BODY_BYTES, REWARD_SUFFIX, SESSION_HEADER, SESSIONS_PATH
from rlfleet.services.rollout.openai_api.wire import error_body
from rlfleet.services.rollout.router import NoHealthyReplica, ReplicaRouter

log = logging.getLogger(__name__)

RELAY_CHUNK = 64 * 1024
CONNECT_SECONDS = 10.0          # a replica that does not take the connection by then is unreachable
UPSTREAM_SECONDS = 3600.0


class ReplicaUnreachable(OSError):
    """The replica's endpoint could not be connected to (refused, no route, failed TLS): it is marked down."""


def session_in_path(path: str) -> str | None:
    """The session a /v1/sessions/<id>[/reward] request names (routed like that session's completions)."""
    if not path.startswith(SESSIONS_PATH):
        return None
    return unquote(path.removeprefix(SESSIONS_PATH).removesuffix(REWARD_SUFFIX)) or None


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
    def __init__(self, address: tuple[str, int], routes: Routes, keys: ApiKeys, tls: ssl.SSLContext | None,
                 max_connections: int) -> None:
        super().__init__(address, _GatewayHandler, max_connections)
        self.routes, self.keys, self.tls = routes, keys, tls


class _GatewayHandler(GuardedHandler):
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

    def _authorized(self) -> bool:
        if self.server.keys.allows(self.headers.get("Authorization", "")):
            return True
        self._error(401, "missing or wrong API key", "authentication_error", "invalid_api_key")
        return False                              # the body is not read: the answer closes the connection

    def do_GET(self) -> None:
        if self._authorized():
            self._relay(b"")

    def do_DELETE(self) -> None:
        if self._authorized():
            self._relay(b"")

    def do_POST(self) -> None:
        if not self._authorized():
            return
        body = self.read_body(MAX_BODY_BYTES)
        if body is not None:
            self._relay(body)

    def _relay(self, body: bytes) -> None:
        session = self.headers.get(SESSION_HEADER) or session_in_path(self.path)
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
            except ReplicaUnreachable as exc:
                log.warning("gateway: replica %s unreachable (%s); marking it down", endpoint, exc)
                router.mark_down(endpoint)
                tried.append(endpoint)
                continue
            except OSError as exc:
                log.warning("gateway: replica %s took a %s %s and failed without an answer (%s)", endpoint,
                            self.command, self.path, exc)
                self._error(502, f"the replica failed without an answer ({type(exc).__name__})", "server_error",
                            "replica_failed")
                return
            self._pass_back(upstream)
            return

    def _open(self, base_url: str, body: bytes) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        url = urlsplit(base_url)
        conn: http.client.HTTPConnection
        if url.scheme == "https":
            conn = http.client.HTTPSConnection(url.hostname or "", url.port, timeout=UPSTREAM_SECONDS,
                                               context=self.server.tls)
        else:
            conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=UPSTREAM_SECONDS)
        path = url.path.removesuffix("/v1") + self.path
        headers = {k: v for k, v in self.headers.items() if k.lower() in
                   ("authorization", "content-type", "accept", SESSION_HEADER.lower())}
        headers["Content-Length"] = str(len(body))
        conn.timeout = CONNECT_SECONDS
        try:
            conn.connect()
        except OSError as exc:
            conn.close()
            raise ReplicaUnreachable(f"{type(exc).__name__}: {exc}") from exc
        if conn.sock is not None:
            conn.sock.settimeout(UPSTREAM_SECONDS)     # a generation may take up to the replica's request_timeout
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

    def __init__(self, routes: Routes, host: str = "127.0.0.1", port: int = 0,
                 api_key: str | Sequence[str] | None = None, tls: ssl.SSLContext | None = None,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        """api_key: the key (or keys, one per tenant) callers must send; None: none. tls: how to verify replicas
        that speak HTTPS (a context trusting the run CA). max_connections: served at once; more are refused."""
        self.routes = routes
        super().__init__(_GatewayServer((host, port), routes, ApiKeys(api_key), tls, max_connections), host, "http",
                         "openai-gateway")

    def stop(self) -> None:
        super().stop()
        self.routes.close()
