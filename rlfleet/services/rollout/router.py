"""Route calls across rollout replicas: session affinity, health checks, fail-over.

Inside a run, work reaches replicas by pull (each replica Claims groups from the buffer as it has room), and a
group's rollout function — every turn of every TITO session in it — runs inside the replica that claimed it, so a
session's prefix cache is always on its replica. This router is for callers outside that loop (evaluation, an external
agent service, a benchmark): Rollout.Generate calls (`generate`), and the OpenAI gateway's HTTP requests
(rlfleet/services/rollout/openai_api/gateway.py, through `pick` and `mark_down`). It sends every call of a session to
the same
healthy replica (rendezvous hashing on the session id: when a replica goes away only its sessions move, and they come
back when it returns), sends calls without a session to the least-loaded healthy replica, checks health
(grpc.health.v1) in the background and at once when a call fails with UNAVAILABLE, and retries that call on the next
replica.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import grpc
import xxhash
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.runtime.rpc import channel
from rlfleet.security.identity import Credential
from rlfleet.v1 import rollout_pb2, rollout_pb2_grpc

log = logging.getLogger(__name__)


class NoHealthyReplica(RuntimeError):
    """Every replica failed its health check."""


def rendezvous(session_id: str, endpoints: Sequence[str]) -> list[str]:
    """Endpoints in preference order for a session (highest random weight first): stable per session."""
    return sorted(endpoints, key=lambda e: xxhash.xxh64_intdigest(f"{session_id}|{e}".encode()), reverse=True)


class ReplicaRouter:
    """Thread-safe. health(endpoint) -> bool may be injected (tests); the default asks grpc.health.v1."""

    def __init__(self, endpoints: Sequence[str], token: Credential = None, check_interval: float = 2.0,
                 health: Callable[[str], bool] | None = None) -> None:
        if not endpoints:
            raise ValueError("a router needs at least one replica endpoint")
        self.endpoints = list(endpoints)
        self._channels = {e: channel(e, token) for e in self.endpoints}
        self._stubs = {e: rollout_pb2_grpc.RolloutStub(ch) for e, ch in self._channels.items()}
        self._health = health or self._grpc_health
        self._lock = threading.Lock()
        self._healthy = set(self.endpoints)
        self._load = dict.fromkeys(self.endpoints, 0)
        self._stop = threading.Event()
        self.check_now()
        self._thread = threading.Thread(target=self._check_loop, args=(check_interval,), name="router-health",
                                        daemon=True)
        self._thread.start()

    # ---- routing --------------------------------------------------------------------------------------------------
    def healthy(self) -> list[str]:
        with self._lock:
            return [e for e in self.endpoints if e in self._healthy]

    def pick(self, session_id: str | None = None, exclude: Sequence[str] = ()) -> str:
        live = [e for e in self.healthy() if e not in exclude]
        if not live:
            raise NoHealthyReplica(f"no healthy rollout replica among {self.endpoints}")
        if session_id is not None:
            return rendezvous(session_id, live)[0]
        with self._lock:
            return min(live, key=lambda e: (self._load[e], self.endpoints.index(e)))

    def generate(self, request: rollout_pb2.GenerateRequest, session_id: str | None = None,
                 timeout: float = 600.0) -> tuple[str, rollout_pb2.GenerateReply]:
        """Generate on the session's replica; on UNAVAILABLE mark it down and retry on the next. -> (endpoint, reply)"""
        tried: list[str] = []
        while True:
            endpoint = self.pick(session_id, exclude=tried)
            with self._lock:
                self._load[endpoint] += 1
            try:
                return endpoint, self._stubs[endpoint].Generate(request, timeout=timeout)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                log.warning("replica %s unavailable; marking it down and retrying elsewhere", endpoint)
                self._mark(endpoint, False)
                tried.append(endpoint)
            finally:
                with self._lock:
                    self._load[endpoint] -= 1

    # ---- health ---------------------------------------------------------------------------------------------------
    def mark_down(self, endpoint: str) -> None:
        """A caller's own call to the replica failed (the gateway's HTTP relay): route around it until it passes a
        health check again."""
        self._mark(endpoint, False)

    def check_now(self) -> None:
        for e in self.endpoints:
            self._mark(e, self._health(e))

    def _mark(self, endpoint: str, ok: bool) -> None:
        with self._lock:
            was = endpoint in self._healthy
            (self._healthy.add if ok else self._healthy.discard)(endpoint)
        if was != ok:
            log.info("replica %s is %s", endpoint, "healthy again" if ok else "down")

    def _grpc_health(self, endpoint: str) -> bool:
        try:
            reply = health_pb2_grpc.HealthStub(self._channels[endpoint]).Check(
                health_pb2.HealthCheckRequest(service="rlfleet.v1.Rollout"), timeout=1.0, wait_for_ready=True)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def _check_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.check_now()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for ch in self._channels.values():
            ch.close()
