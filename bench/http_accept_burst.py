"""How long a burst of new connections waits to be accepted: the HTTP server the OpenAI endpoint and the gateway run
(`ThreadedHTTPServer`, listen backlog SOMAXCONN) against the stdlib's `ThreadingHTTPServer` (backlog 5), in one run.

    python bench/http_accept_burst.py [--connections 64] [--busy-threads 8] [--rounds 3]

An agent opens a claim's episodes at once (the calculator example: 8 groups x 8 episodes, each its own connection),
while the replica's engine and the episodes' own threads keep the GIL busy. Each round starts `--busy-threads`
Python threads that spin (GIL pressure, as the engine's per-op Python and the clients' threads cause), opens
`--connections` connections at once, each sending one GET and reading the answer, and records each one's seconds
to connect (the kernel's handshake: the server's accept() is not needed while the listen backlog has room) and to
the answer. A SYN the kernel drops because the accept queue is full is resent after 1 s, then 3 s and 7 s in all:
the openai client's connect timeout is 5 s. Prints, per server and for both, the median and worst seconds and how
many connections took over 0.9 s (one resent SYN) and over 2.9 s (two).

The connect figures are the point. The answer figures are set by the GIL the spinning threads hog: with every
connection accepted at once, all of them wait for it together, where the stdlib's dropped ones arrive a second later
to a quieter process. What the backlog buys a real run is measured on the calculator example (8 episodes x 8 groups
a claim, alternating runs, 2026-12-04): at backlog 5, 1-10 episodes a run failed with APIConnectionError and 56-149
samples were dropped as stale (their groups finished late); at SOMAXCONN none; 69.3 vs 60.3 samples/s (1.15x).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rlfleet.services.rollout.openai_api.background import ThreadedHTTPServer  # noqa: E402


class _Hello(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Stdlib(ThreadingHTTPServer):
    daemon_threads = True                    # request_queue_size stays the stdlib's 5


def _burst(server: ThreadingHTTPServer, connections: int, busy_threads: int) -> list[tuple[float, float]]:
    """(seconds to connect, seconds to the answer) of each connection."""
    port = server.server_address[1]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(200))

    def one(out: list[tuple[float, float]]) -> None:
        t = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
            connected = time.monotonic() - t
            c.sendall(b"GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            while c.recv(4096):
                pass
        out.append((connected, time.monotonic() - t))

    spinners = [threading.Thread(target=spin, daemon=True) for _ in range(busy_threads)]
    for s in spinners:
        s.start()
    times: list[tuple[float, float]] = []
    clients = [threading.Thread(target=one, args=(times,)) for _ in range(connections)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    stop.set()
    for s in spinners:
        s.join()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--busy-threads", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    servers: dict[str, ThreadingHTTPServer] = {
        "stdlib ThreadingHTTPServer (backlog 5)": _Stdlib(("127.0.0.1", 0), _Hello),
        "rlfleet ThreadedHTTPServer": ThreadedHTTPServer(("127.0.0.1", 0), _Hello)}
    for s in servers.values():
        threading.Thread(target=s.serve_forever, daemon=True).start()
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in servers}
    for _ in range(a.rounds):                               # interleaved: both see the same machine
        for name, s in servers.items():
            results[name] += _burst(s, a.connections, a.busy_threads)
    print(f"{a.rounds} rounds of {a.connections} connections at once, {a.busy_threads} GIL-busy threads")
    for name, pairs in results.items():
        for what, times in (("connect", [c for c, _ in pairs]), ("answer", [t for _, t in pairs])):
            print(f"  {name:40s} {what:7s} median {statistics.median(times):.3f} s  worst {max(times):.2f} s  "
                  f"> 0.9 s: {sum(t > 0.9 for t in times):3d}  > 2.9 s: {sum(t > 2.9 for t in times):3d}  "
                  f"of {len(times)}")
    for s in servers.values():
        s.shutdown()
        s.server_close()


if __name__ == "__main__":
    main()
