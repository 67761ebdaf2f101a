"""An HTTP server run on a background thread: the replica's endpoint and the run's gateway both are one.

`ThreadedHTTPServer` is their common server: one daemon thread per connection, a listen backlog that holds an
agent's burst of new connections (the stdlib's default of 5 drops the rest's SYNs, and each dropped SYN costs its
client a 1 s retransmission; three in a row exceed the openai client's 5 s connect timeout and fail the request), and
TLS whose handshake runs on the connection's own thread under a deadline, so a peer that connects and never speaks
cannot stall the accept loop for everyone else.

It serves at most `max_connections` connections at once: one beyond that is answered 503 (plain HTTP) or closed
(TLS, before its handshake) at accept, never queued as a thread. With the handlers' read deadlines
(rlfleet/services/rollout/openai_api/guarded.py: a client that sends nothing or half a request is dropped after
`header_seconds`) idle connections cannot hold the cap for long.
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from rlfleet.services.rollout.openai_api.guarded import BODY_SECONDS, HEADER_SECONDS, IO_SECONDS

log = logging.getLogger(__name__)

HANDSHAKE_SECONDS = 10.0      # a TLS client that has not finished its handshake by then is dropped
MAX_CONNECTIONS = 256         # connections served at once (each is a thread); more are refused at accept
_REFUSAL_BODY = json.dumps({"error": {"message": "too many connections", "type": "server_error",
                                       "code": "too_many_connections"}}).encode()
REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
           b"Retry-After: 1\r\nContent-Length: " + str(len(_REFUSAL_BODY)).encode() + b"\r\n\r\n" + _REFUSAL_BODY)


class ThreadedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = socket.SOMAXCONN      # the kernel caps it at net.core.somaxconn
    handshake_seconds = HANDSHAKE_SECONDS
    header_seconds, body_seconds, io_seconds = HEADER_SECONDS, BODY_SECONDS, IO_SECONDS

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 max_connections: int = MAX_CONNECTIONS) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self.refused = 0                          # connections refused at accept for the cap
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection on a thread of its own if a slot is free; otherwise refuse it at once."""
        if not self._slots.acquire(blocking=False):
            self._refuse(request, client_address)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _refuse(self, request: Any, client_address: Any) -> None:
        self.refused += 1
        if self.refused == 1 or self.refused % 100 == 0:
            log.warning("%d connections at once (the cap): refused %s (%d refused so far)", self.max_connections,
                        client_address, self.refused)
        if not isinstance(request, ssl.SSLSocket):      # a TLS peer has not handshaken: it only sees the close
            try:
                request.setblocking(False)
                request.send(REFUSAL)
            except OSError:
                pass
        self.shutdown_request(request)

    def serve_tls(self, context: ssl.SSLContext, handshake_seconds: float = HANDSHAKE_SECONDS) -> None:
        """Speak TLS with `context`. accept() no longer handshakes; finish_request does, on the connection's thread."""
        self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.handshake_seconds = handshake_seconds

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            request.settimeout(self.handshake_seconds)
            request.do_handshake()
            request.settimeout(None)
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed (a peer that hung up, a failed or timed-out handshake): logged, not printed."""
        log.debug("connection from %s failed", client_address, exc_info=True)


class BackgroundHTTP:
    """`http` served by a daemon thread between start() and stop(); `base_url` is what an openai client is given."""

    def __init__(self, http: ThreadingHTTPServer, host: str, scheme: str, thread_name: str) -> None:
        self._http = http
        self.host, self.port, self.scheme = host, int(http.server_address[1]), scheme
        self._thread = threading.Thread(target=http.serve_forever, name=thread_name, daemon=True)

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"{self.scheme}://{host}:{self.port}/v1"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket; also for a server that was never started (shutdown would wait)."""
        started = self._thread.ident is not None
        if started:
            self._http.shutdown()
        self._http.server_close()
        if started:
            self._thread.join(timeout=5)
