"""A private redis-server for tests: free loopback port, AOF on (appendfsync always), no RDB, in a temp folder.

kill9() and restart() simulate a crash; the same port and folder are reused, so the AOF is replayed.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from rlfleet.runtime.ports import free_port

REDIS_BIN = shutil.which("redis-server") or "/usr/bin/redis-server"


class RedisServer:
    """One redis-server process; start(), kill9(), restart(), stop()."""

    def __init__(self, directory: Path, port: int | None = None, args: tuple[str, ...] = ()) -> None:
        self.dir = Path(directory)
        self.args = args                # more redis-server options; later ones win (e.g. --appendfsync everysec)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 15.0) -> RedisServer:
        cmd = [REDIS_BIN, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
               "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
               "--protected-mode", "yes", "--logfile", str(self.dir / "redis.log"), *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except (redis.ConnectionError, redis.BusyLoadingError):
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"redis-server did not start: see {self.dir / 'redis.log'}") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self) -> None:
        self.kill9()
        self.start()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill9()
            self.proc = None
