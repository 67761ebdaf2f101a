"""Bounded connections for the OpenAI endpoint and the gateway: what one client may hold of a server.

- **Deadlines on reads.** A connection has `header_seconds` from when the server waits for a request (a new
  connection, or the next request on a kept-alive one) until that request's line and headers are in, and
  `body_seconds` to send the body once it is asked for; a client that sends nothing, or a request a byte at a time,
  is dropped then (each receive waits at most the time left, not a fresh timeout per byte). Every other socket
  operation (writing the answer) waits at most `io_seconds`.
- **The body is read only when asked for** (`read_body`, after the API key check): an answer sent before it (401,
  404, 413) says `Connection: close` and the connection ends, so unread body bytes are never taken for a request.
  A client that asks `Expect: 100-continue` is told to go on only once its key is checked.
  Chunked bodies are refused (411): clients send Content-Length.

`ThreadedHTTPServer` (background.py) caps the connections served at once and refuses the rest at accept.
"""

from __future__ import annotations

import io
import socket
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

HEADER_SECONDS = 30.0      # longer than httpx's 5 s keep-alive expiry: an idle pooled connection is the client's to end
BODY_SECONDS = 120.0       # 8 MiB at ~70 KB/s
IO_SECONDS = 60.0          # a reader that takes nothing of the answer (or an SSE stream) for this long is dropped


class _DeadlineReader(io.RawIOBase):
    """The connection's bytes; each receive waits at most until `deadline` (time.monotonic()), else `io_seconds`."""

    def __init__(self, sock: socket.socket, io_seconds: float) -> None:
        super().__init__()
        self._sock, self._io = sock, io_seconds
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        wait = self._io
        if self.deadline is not None:
            wait = min(wait, self.deadline - time.monotonic())
            if wait <= 0:
                raise TimeoutError("the client did not send its request in time")
        self._sock.settimeout(wait)
        try:
            return self._sock.recv_into(buffer)
        finally:
            self._sock.settimeout(self._io)


class GuardedHandler(BaseHTTPRequestHandler):
    """A request handler whose reads run under the server's deadlines. Subclasses answer errors with `_error` and read
    a body only through `read_body`."""

    server: Any

    def setup(self) -> None:
        super().setup()
        self.rfile.close()                          # the stdlib's unbounded reader: replaced, its reference dropped
        io_seconds = float(self.server.io_seconds)
        self.connection.settimeout(io_seconds)
        self._reader = _DeadlineReader(self.connection, io_seconds)
        self.rfile = io.BufferedReader(self._reader)
        self._body_read = False

    def handle_one_request(self) -> None:
        self._reader.deadline = time.monotonic() + float(self.server.header_seconds)
        self._body_read = False
        super().handle_one_request()                # a TimeoutError there closes the connection

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self._reader.deadline = None
        return ok

    def _error(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> None:
        raise NotImplementedError

    def _authorized(self) -> bool:
        """Whether the request carries a valid key; answers 401 itself when not."""
        raise NotImplementedError

    def handle_expect_100(self) -> bool:
        """`Expect: 100-continue`: the client waits for a go before it sends the body. It gets one only with a valid
        key; without, the 401 (and the connection's end) instead."""
        if not self._authorized():
            return False
        self.send_response_only(100)
        BaseHTTPRequestHandler.end_headers(self)      # an interim answer: the body is still to come
        return True

    def _declares_body(self) -> bool:
        headers = getattr(self, "headers", None)
        if headers is None:
            return False
        return headers.get("Content-Length", "0").strip() not in ("", "0") or "Transfer-Encoding" in headers

    def end_headers(self) -> None:
        if not self.close_connection and not self._body_read and self._declares_body():
            self.send_header("Connection", "close")     # the unread body must not be parsed as the next request
        super().end_headers()

    def read_body(self, limit: int) -> bytes | None:
        """The request's body (at most `limit` bytes, within body_seconds); None when refused (answered here)."""
        if "Transfer-Encoding" in self.headers:
            self._error(411, "send the body with a Content-Length (chunked bodies are not accepted)")
            return None
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 <= length <= limit:
            self._error(413, f"request body must be 0..{limit} bytes")
            return None
        self._reader.deadline = time.monotonic() + float(self.server.body_seconds)
        try:
            data = self.rfile.read(length)
        finally:
            self._reader.deadline = None
        if len(data) < length:                      # the client hung up inside its body: nobody to answer
            self.close_connection = True
            return None
        self._body_read = True
        return data
