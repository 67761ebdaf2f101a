"""Every RPC of every rlfleet service x every role x {no credential, wrong CA, expired, wrong role, right role}.

One mTLS server (rlfleet.runtime.rpc.Server with the run's interceptor) hosts every service of the protos with handlers
that
answer the default reply, so the table alone decides. The expected allow-list is written out here by hand.
Refusals at the TLS handshake (no certificate, a foreign CA, an expired certificate) never reach a handler: the
client sees UNAVAILABLE and the server reads no byte of the request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory

from rlfleet.runtime.rpc import Server, channel
from rlfleet.v1 import buffer_pb2, rollout_pb2, trainer_pb2, weight_sync_pb2
from tests.security.pki_fixtures import ROLE_NAMES, RunPki, make_pki

ROLES = tuple(ROLE_NAMES)
OBS = {"controller", "operator"}
EXPECTED: dict[str, set[str]] = {
    "/rlfleet.v1.Buffer/Claim": {"rollout"},
    "/rlfleet.v1.Buffer/Put": {"rollout"},
    "/rlfleet.v1.Buffer/GetBatch": {"trainer"},
    "/rlfleet.v1.Buffer/Ack": {"trainer"},
    "/rlfleet.v1.Buffer/Reject": {"trainer"},
    "/rlfleet.v1.Buffer/Stats": {"trainer"} | OBS,
    "/rlfleet.v1.Buffer/TrainerResume": {"trainer"},
    "/rlfleet.v1.Rollout/Generate": {"trainer", "operator"},
    "/rlfleet.v1.Rollout/Pause": {"trainer"} | OBS,
    "/rlfleet.v1.Rollout/Resume": {"trainer"} | OBS,
    "/rlfleet.v1.Rollout/LoadWeights": {"trainer"},
    "/rlfleet.v1.Rollout/Status": {"trainer"} | OBS,
    "/rlfleet.v1.Trainer/Status": OBS,
    "/rlfleet.v1.Trainer/Checkpoint": OBS,
    "/rlfleet.v1.WeightSync/Publish": {"trainer"},
    "/rlfleet.v1.WeightSync/Subscribe": {"rollout"},
    "/rlfleet.v1.WeightSync/Ack": {"rollout"},
    "/rlfleet.v1.WeightSync/Verify": {"trainer", "rollout"} | OBS,
    "/rlfleet.v1.WeightSync/Register": {"trainer", "rollout"},
    "/rlfleet.v1.WeightSync/Peers": {"trainer", "rollout"},
    "/rlfleet.v1.WeightStream/Fetch": {"rollout"},
}


def _methods() -> list[tuple[str, Any, Any, bool]]:
    """(full name, request class, reply class, server streaming) of every RPC in the rlfleet protos."""
    out = []
    for mod in (buffer_pb2, rollout_pb2, trainer_pb2, weight_sync_pb2):
        for svc in mod.DESCRIPTOR.services_by_name.values():
            for m in svc.methods:
                out.append((f"/{svc.full_name}/{m.name}", message_factory.GetMessageClass(m.input_type),
                            message_factory.GetMessageClass(m.output_type), m.server_streaming))
    return out


def _handlers(server: grpc.Server) -> None:
    by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
    for full, req, rep, streaming in _methods():
        service, method = full.strip("/").split("/")
        if streaming:
            handler = grpc.unary_stream_rpc_method_handler(lambda r, c, rep=rep: iter([rep()]),
                                                           request_deserializer=req.FromString,
                                                           response_serializer=rep.SerializeToString)
        else:
            handler = grpc.unary_unary_rpc_method_handler(lambda r, c, rep=rep: rep(),
                                                          request_deserializer=req.FromString,
                                                          response_serializer=rep.SerializeToString)
        by_service.setdefault(service, {})[method] = handler
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(s, h) for s, h in by_service.items()])


def _request(full: str, req: Any, role: str) -> Any:
    """A request naming the caller where the method names one (replica_id, peer_id, samples' replica_id)."""
    name = ROLE_NAMES[role]
    msg = req()
    for field in ("replica_id", "peer_id"):
        if field in msg.DESCRIPTOR.fields_by_name:
            setattr(msg, field, "trainer" if field == "peer_id" and role == "trainer" else name)
    return msg


def _call(ch: grpc.Channel, full: str, req: Any, rep: Any, streaming: bool, msg: Any) -> grpc.StatusCode:
    try:
        if streaming:
            list(ch.unary_stream(full, request_serializer=req.SerializeToString,
                                 response_deserializer=rep.FromString)(msg, timeout=5))
        else:
            ch.unary_unary(full, request_serializer=req.SerializeToString,
                           response_deserializer=rep.FromString)(msg, timeout=5)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.fixture(scope="module")
def pki() -> RunPki:
    return make_pki()


@pytest.fixture(scope="module")
def served(pki: RunPki) -> Iterator[str]:
    server = Server("127.0.0.1:0", pki.good["buffer"], max_workers=8)
    _handlers(server.grpc)
    server.start()
    yield f"127.0.0.1:{server.port}"
    server.stop(0)


def test_table_covers_every_rpc_of_the_protos() -> None:
    assert {m[0] for m in _methods()} == set(EXPECTED)


def test_authorization_matrix(pki: RunPki, served: str) -> None:
    counts: Counter[tuple[str, str]] = Counter()
    wrong: list[str] = []
    for full, req, rep, streaming in _methods():
        for role in ROLES:
            msg = _request(full, req, role)
            cells = {
                "no credential": (grpc.insecure_channel(served), grpc.StatusCode.UNAVAILABLE),
                "no client certificate": (grpc.secure_channel(served, grpc.ssl_channel_credentials(pki.ca.cert_pem)),
                                          grpc.StatusCode.UNAVAILABLE),
                "wrong CA": (channel(served, pki.wrong_ca[role]), grpc.StatusCode.UNAVAILABLE),
                "expired": (channel(served, pki.expired[role]), grpc.StatusCode.UNAVAILABLE),
                "right role" if role in EXPECTED[full] else "wrong role": (
                    channel(served, pki.good[role]),
                    grpc.StatusCode.OK if role in EXPECTED[full] else grpc.StatusCode.PERMISSION_DENIED),
            }
            for case, (ch, want) in cells.items():
                with ch:
                    got = _call(ch, full, req, rep, streaming, msg)
                counts[(case, got.name)] += 1
                if got != want:
                    wrong.append(f"{full} as {role} ({case}): {got.name}, expected {want.name}")
    print("authorization matrix:", dict(sorted(counts.items())))
    assert not wrong, "\n".join(wrong[:20])
    assert counts[("right role", "OK")] == sum(len(v) for v in EXPECTED.values())
    assert counts[("wrong role", "PERMISSION_DENIED")] == len(EXPECTED) * len(ROLES) - counts[("right role", "OK")]


def test_requests_naming_another_component_are_refused(pki: RunPki, served: str) -> None:
    with channel(served, pki.good["rollout"]) as ch:
        claim = buffer_pb2.ClaimRequest(replica_id="rollout-1", restarted=True)
        assert _call(ch, "/rlfleet.v1.Buffer/Claim", buffer_pb2.ClaimRequest, buffer_pb2.ClaimReply, False,
                     claim) == grpc.StatusCode.PERMISSION_DENIED
        register = weight_sync_pb2.PeerInfo(peer_id="trainer", transport="broadcast")
        assert _call(ch, "/rlfleet.v1.WeightSync/Register", weight_sync_pb2.PeerInfo, weight_sync_pb2.RegisterReply,
                     False, register) == grpc.StatusCode.PERMISSION_DENIED
        put = buffer_pb2.PutRequest()
        put.samples.add(group_id="g", replica_id="rollout-7")
        assert _call(ch, "/rlfleet.v1.Buffer/Put", buffer_pb2.PutRequest, buffer_pb2.PutReply, False,
                     put) == grpc.StatusCode.PERMISSION_DENIED
    with channel(served, pki.good["trainer"]) as ch:
        register = weight_sync_pb2.PeerInfo(peer_id="rollout-0", transport="nixl")
        assert _call(ch, "/rlfleet.v1.WeightSync/Register", weight_sync_pb2.PeerInfo, weight_sync_pb2.RegisterReply,
                     False, register) == grpc.StatusCode.PERMISSION_DENIED
