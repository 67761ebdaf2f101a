"""Every server answers health checks without a token and refuses other calls without the run token."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlfleet.runtime.rpc import Server, channel, wait_healthy
from rlfleet.v1 import trainer_pb2, trainer_pb2_grpc


class _Trainer(trainer_pb2_grpc.TrainerServicer):
    def Status(self, request: trainer_pb2.TrainerStatusRequest,
               context: grpc.ServicerContext) -> trainer_pb2.TrainerStatus:
        return trainer_pb2.TrainerStatus(step=7)


@pytest.fixture
def server() -> Iterator[str]:
    srv = Server("127.0.0.1:0", token="s3cret")
    srv.add(trainer_pb2_grpc.add_TrainerServicer_to_server, _Trainer(), "rlfleet.v1.Trainer")
    srv.start()
    yield f"127.0.0.1:{srv.port}"
    srv.stop(0)


def test_token_required(server: str) -> None:
    wait_healthy(server, timeout=10)
    with channel(server, "s3cret") as ch:
        assert trainer_pb2_grpc.TrainerStub(ch).Status(trainer_pb2.TrainerStatusRequest(), timeout=5).step == 7
    for token in (None, "wrong"):
        with channel(server, token) as ch, pytest.raises(grpc.RpcError) as info:
            trainer_pb2_grpc.TrainerStub(ch).Status(trainer_pb2.TrainerStatusRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_health_needs_no_token(server: str) -> None:
    with grpc.insecure_channel(server) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for name in ("", "rlfleet.v1.Trainer"):
            resp = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
