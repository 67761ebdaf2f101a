"""An HTTP server run on a background thread: the replica's endpoint and the run's gateway both are one."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from typing import Self


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
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)
