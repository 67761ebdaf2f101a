"""An HTTP server run on a background thread: the replica's endpoint and the run's gateway both are one.

`ThreadedHTTPServer` is their common server: one daemon thread per connection, a listen backlog that holds an
agent's burst of new connections (the stdlib's default of 5 drops the rest's SYNs, and each dropped SYN costs its
client a 1 s retransmission; three in a row exceed the openai client's 5 s connect timeout and fail the request), and
TLS whose handshake runs on the connection's own thread under a deadline, so a peer that connects and never speaks
cannot stall the accept loop for everyone else.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from http.server import ThreadingHTTPServer
from typing import Any, Self

log = logging.getLogger(__name__)

HANDSHAKE_SECONDS = 10.0      # a TLS client that has not finished its handshake by then is dropped


class ThreadedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = socket.SOMAXCONN      # the kernel caps it at net.core.somaxconn
    handshake_seconds = HANDSHAKE_SECONDS

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
