"""Hypothesis fuzzing of every Buffer and WeightSync RPC against live servers over mTLS (callers hold the allowed
role): random messages built from the proto descriptors, and raw random bytes. Every call must end with a clear
status (never UNKNOWN, i.e. an unhandled exception; DEADLINE_EXCEEDED only for the Subscribe stream), and the
servers must stay healthy. RLFLEET_FUZZ_EXAMPLES sets examples per RPC (CI: 15; the figures use 1000)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlfleet.runtime.rpc import Server, channel, wait_healthy
from rlfleet.sample.limits import SampleLimits
from rlfleet.services.buffer.core import BufferCore
from rlfleet.services.buffer.server import start_server
from rlfleet.services.buffer.settings import BufferSettings
from rlfleet.services.buffer.stores.embedded import EmbeddedStore
from rlfleet.v1 import buffer_pb2, weight_sync_pb2, weight_sync_pb2_grpc
from tests.security.pki_fixtures import make_pki

EXAMPLES = int(os.environ.get("RLFLEET_FUZZ_EXAMPLES", "15"))
DEADLINE = 2.0
CALLERS = {"Buffer/Claim": "rollout", "Buffer/Put": "rollout", "Buffer/GetBatch": "trainer", "Buffer/Ack": "trainer",
           "Buffer/Reject": "trainer", "Buffer/Stats": "trainer", "Buffer/TrainerResume": "trainer",
           "WeightSync/Publish": "trainer",
           "WeightSync/Subscribe": "rollout", "WeightSync/Ack": "rollout", "WeightSync/Verify": "trainer",
           "WeightSync/Register": "rollout", "WeightSync/Peers": "trainer"}
COUNTS: dict[str, Counter[str]] = {}

_INTS = {FieldDescriptor.TYPE_INT32: (-2**31, 2**31 - 1), FieldDescriptor.TYPE_INT64: (-2**63, 2**63 - 1),
         FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1), FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
         FieldDescriptor.TYPE_ENUM: (0, 5)}


def _scalar(f: FieldDescriptor) -> st.SearchStrategy[Any]:
    if f.name == "wait_seconds":                       # tiny waits: long polls must not eat the example budget
        return st.sampled_from([0.0, 0.01, -1.0, float("nan"), float("inf")])
    if f.type in _INTS:
        lo, hi = _INTS[f.type]
        return st.one_of(st.integers(0, 8), st.integers(lo, hi))
    if f.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return st.floats(allow_nan=True, allow_infinity=True, width=32 if f.type == FieldDescriptor.TYPE_FLOAT else 64)
    if f.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if f.type == FieldDescriptor.TYPE_STRING:
        names = st.sampled_from(["g0", "g1", "rollout-0", "trainer", "broadcast", "nixl"])
        return st.one_of(names, st.text(max_size=20))
    return st.binary(max_size=64)


def messages(cls: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for f in cls.DESCRIPTOR.fields:
        if f.message_type is not None:
            if f.message_type.GetOptions().map_entry or depth >= 2:
                continue
            inner = messages(message_factory.GetMessageClass(f.message_type), depth + 1)
            parts[f.name] = st.lists(inner, max_size=3) if f.is_repeated else inner
        elif f.is_repeated:
            parts[f.name] = st.lists(_scalar(f), max_size=4)
        else:
            parts[f.name] = _scalar(f)

    def build(values: dict[str, Any]) -> Any:
        msg = cls()
        for name, v in values.items():
            field = cls.DESCRIPTOR.fields_by_name[name]
            if field.message_type is not None:
                if field.is_repeated:
                    getattr(msg, name).extend(v)
                else:
                    getattr(msg, name).CopyFrom(v)
            elif field.is_repeated:
                getattr(msg, name).extend(v)
            else:
                setattr(msg, name, v)
        return msg

    return st.fixed_dictionaries({}, optional=parts).map(build)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from prometheus_client import CollectorRegistry

    from rlfleet.runtime.metrics import WeightSyncMetrics
    from rlfleet.services.weight_sync.board import VersionBoard
    from rlfleet.services.weight_sync.servicer import WeightSyncServicer

    pki = make_pki()
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    settings_ = BufferSettings(capacity=64, group_size=2, groups_per_step=1, steps=1000, max_staleness=100,
                               lease_seconds=60.0, min_valid_per_group=1)
    core = BufferCore(EmbeddedStore(tmp / "buffer", fsync="no"), settings_,
                      limits=SampleLimits(vocab_size=100), version_lead=1)
    buffer = start_server(core, "127.0.0.1:0", pki.good["buffer"])
    board = VersionBoard()
    ws = Server("127.0.0.1:0", pki.good["weight_sync"], max_workers=32)
    ws.add(weight_sync_pb2_grpc.add_WeightSyncServicer_to_server,
           WeightSyncServicer(board, WeightSyncMetrics(CollectorRegistry())), "rlfleet.v1.WeightSync")
    ws.start()
    addr = {"Buffer": f"127.0.0.1:{buffer.port}", "WeightSync": f"127.0.0.1:{ws.port}"}
    chans = {(svc, role): channel(a, pki.good[role]) for svc, a in addr.items() for role in ("rollout", "trainer")}
    yield {"chans": chans, "addr": addr, "pki": pki}
    for c in chans.values():
        c.close()
    print("fuzz status counts per RPC:", {k: dict(v) for k, v in sorted(COUNTS.items())})
    for a in addr.values():
        wait_healthy(a, 5, token=pki.good["trainer"])          # both servers survived everything
    buffer.stop(0)
    ws.stop(0)
    board.close()
    core.close()


def _classes(rpc: str) -> tuple[Any, Any, bool]:
    svc, method = rpc.split("/")
    mod = buffer_pb2 if svc == "Buffer" else weight_sync_pb2
    m = mod.DESCRIPTOR.services_by_name[svc].methods_by_name[method]
    return (message_factory.GetMessageClass(m.input_type), message_factory.GetMessageClass(m.output_type),
            m.server_streaming)


def _call(live: dict[str, Any], rpc: str, payload: bytes) -> grpc.StatusCode:
    svc = rpc.split("/")[0]
    ch = live["chans"][(svc, CALLERS[rpc])]
    _, _, streaming = _classes(rpc)
    full = f"/rlfleet.v1.{rpc}"
    deadline = 0.3 if streaming else DEADLINE         # a valid Subscribe streams until its deadline
    try:
        if streaming:
            for _ in ch.unary_stream(full, request_serializer=lambda b: b, response_deserializer=lambda b: b)(
                    payload, timeout=deadline):
                pass
        else:
            ch.unary_unary(full, request_serializer=lambda b: b, response_deserializer=lambda b: b)(
                payload, timeout=DEADLINE)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def _check(rpc: str, code: grpc.StatusCode) -> None:
    COUNTS.setdefault(rpc, Counter())[code.name] += 1
    assert code != grpc.StatusCode.UNKNOWN, f"{rpc}: an unhandled exception in the handler"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        assert rpc == "WeightSync/Subscribe", f"{rpc} hung past its {DEADLINE}s deadline"


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("rpc", list(CALLERS))
def test_fuzz_every_rpc(live: dict[str, Any], rpc: str) -> None:
    req, _, _ = _classes(rpc)
    role = CALLERS[rpc]
    name = "rollout-0" if role == "rollout" else "trainer"

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(msg=messages(req), own=st.booleans(), raw=st.one_of(st.none(), st.binary(max_size=256)))
    def run(msg: Any, own: bool, raw: bytes | None) -> None:
        if own:                                        # half the time the request names the caller (passes binding)
            for field in ("replica_id", "peer_id"):
                if field in req.DESCRIPTOR.fields_by_name:
                    setattr(msg, field, name)
            if req is buffer_pb2.PutRequest:
                for s in msg.samples:
                    s.replica_id = name
        _check(rpc, _call(live, rpc, msg.SerializeToString() if raw is None else raw))

    run()
