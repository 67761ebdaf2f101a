"""The replica router over real gRPC servers: session affinity, health checks, fail-over and return."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from rlfleet.runtime.rpc import Server
from rlfleet.sample.packed_arrays import pack_i32, unpack_i32
from rlfleet.services.rollout.router import ReplicaRouter, rendezvous
from rlfleet.v1 import rollout_pb2, rollout_pb2_grpc

TOKEN = "t0ken"


class Echo(rollout_pb2_grpc.RolloutServicer):
    """Answers Generate with its own replica number as the only output token."""

    def __init__(self, number: int) -> None:
        self.number = number

    def Generate(self, request: rollout_pb2.GenerateRequest, context: grpc.ServicerContext
                 ) -> rollout_pb2.GenerateReply:
        return rollout_pb2.GenerateReply(generations=[rollout_pb2.Generation(output_ids=pack_i32([self.number]))
                                                      for _ in request.input_ids])


def _serve(number: int, address: str = "127.0.0.1:0") -> Server:
    server = Server(address, TOKEN)
    server.add(rollout_pb2_grpc.add_RolloutServicer_to_server, Echo(number), "rlfleet.v1.Rollout")
    server.start()
    return server


def _request() -> rollout_pb2.GenerateRequest:
    return rollout_pb2.GenerateRequest(input_ids=[pack_i32([1, 2, 3])])


def _who(reply: rollout_pb2.GenerateReply) -> int:
    return int(unpack_i32(reply.generations[0].output_ids)[0])


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    running = [_serve(0), _serve(1)]
    yield running
    for s in running:
        s.stop(0)


def test_sessions_stick_fail_over_and_come_back(servers: list[Server]) -> None:
    endpoints = [f"127.0.0.1:{s.port}" for s in servers]
    router = ReplicaRouter(endpoints, TOKEN, check_interval=0.2)
    try:
        sessions = [f"episode-{i}" for i in range(16)]
        home = {sid: _who(router.generate(_request(), sid)[1]) for sid in sessions}
        assert set(home.values()) == {0, 1}, "sessions spread over both replicas"
        for sid in sessions:                                         # every later turn: the same replica
            assert _who(router.generate(_request(), sid)[1]) == home[sid]
        assert all(endpoints[home[s]] == rendezvous(s, endpoints)[0] for s in sessions)

        servers[0].stop(0)                                           # replica 0 dies
        for sid in sessions:                                         # its sessions move, the others stay
            assert _who(router.generate(_request(), sid)[1]) == 1
        assert router.healthy() == [endpoints[1]]

        servers[0] = _serve(0, endpoints[0])                         # restarted on its address
        deadline = time.monotonic() + 20                             # the background check brings it back
        while router.healthy() != endpoints:
            assert time.monotonic() < deadline, "the restarted replica was not seen healthy again"
            time.sleep(0.1)
        for sid in sessions:
            assert _who(router.generate(_request(), sid)[1]) == home[sid]
    finally:
        router.close()


def test_calls_without_a_session_go_to_the_least_loaded(servers: list[Server]) -> None:
    endpoints = [f"127.0.0.1:{s.port}" for s in servers]
    up = {e: True for e in endpoints}
    router = ReplicaRouter(endpoints, TOKEN, check_interval=3600, health=lambda e: up[e])
    try:
        assert router.pick() == endpoints[0]
        up[endpoints[0]] = False
        router.check_now()
        assert router.pick() == endpoints[1] and router.pick("any-session") == endpoints[1]
        up[endpoints[1]] = False
        router.check_now()
        with pytest.raises(RuntimeError, match="no healthy rollout replica"):
            router.pick()
    finally:
        router.close()
