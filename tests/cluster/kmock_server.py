"""kmock's in-memory Kubernetes API served on a loopback port from a background thread, for the sync client."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import kmock
from kubernetes import client

_RESOURCES = {
    "v1/pods": ("Pod", True), "v1/nodes": ("Node", False), "v1/events": ("Event", True),
    "v1/configmaps": ("ConfigMap", True), "coordination.k8s.io/v1/leases": ("Lease", True),
}


class KmockApi:
    """Start with start(); api_client() gives an official-client ApiClient pointed at it; stop() ends it."""

    def __init__(self) -> None:
        self.emulator: kmock.KubernetesEmulator | None = None
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._stack: Any = None

    def start(self) -> KmockApi:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._enter(), self._loop).result(timeout=30)
        return self

    async def _enter(self) -> None:
        self.emulator = kmock.KubernetesEmulator()
        for ref, (kind, namespaced) in _RESOURCES.items():
            self.emulator.resources[ref] = kmock.ResourceInfo(kind=kind, namespaced=namespaced,
                                                              verbs={"list", "watch", "get", "create", "update",
                                                                     "patch", "delete"})
        await self.emulator.__aenter__()
        self._server = kmock.Server(self.emulator)
        await self._server.__aenter__()
        self.url = str(self._server.url).rstrip("/")

    def call(self, fn: Callable[[kmock.KubernetesEmulator], Any]) -> Any:
        """Run fn(emulator) on the server's loop (to add reactions or read state safely)."""
        emulator = self.emulator
        assert emulator is not None, "start() first"

        async def run() -> Any:
            return fn(emulator)
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    def api_client(self) -> client.ApiClient:
        cfg = client.Configuration()
        cfg.host = self.url
        return client.ApiClient(cfg)

    def requests(self) -> list[Any]:
        return self.call(lambda em: list(em._requests))

    def stop(self) -> None:
        emulator = self.emulator
        assert emulator is not None, "start() first"

        async def leave() -> None:
            await self._server.__aexit__(None, None, None)
            await emulator.__aexit__(None, None, None)
        try:
            asyncio.run_coroutine_threadsafe(leave(), self._loop).result(timeout=10)
        except TimeoutError:
            pass  # an open watch stream may hold the server; the loop stops below and the thread is a daemon
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
