"""Poison samples and out-of-bounds steps/versions are refused by the real buffer over mTLS with INVALID_ARGUMENT
naming the field; long polls cannot starve the trainer's calls."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from rlfleet.runtime.rpc import Server, channel
from rlfleet.sample.limits import SampleLimits
from rlfleet.services.buffer.core import BufferCore
from rlfleet.services.buffer.server import start_server
from rlfleet.services.buffer.settings import BufferSettings
from rlfleet.services.buffer.stores.embedded import EmbeddedStore
from rlfleet.v1 import buffer_pb2, buffer_pb2_grpc, sample_pb2
from tests.security.pki_fixtures import RunPki, make_pki

VOCAB, EXPERTS = 100, 8


def sample(gid: str, index: int, **fields: object) -> sample_pb2.Sample:
    tokens = 4
    msg = sample_pb2.Sample(
        group_id=gid, index=index, group_size=2, prompt_index=int(gid[1:]), replica_id="rollout-0",
        prompt_ids=np.arange(3, dtype="<i4").tobytes(), response_ids=np.arange(tokens, dtype="<i4").tobytes(),
        loss_mask=np.ones(tokens, dtype="u1").tobytes(), rollout_logprobs=np.full(tokens, -0.5, "<f4").tobytes(),
        reward=float(index), status=sample_pb2.SAMPLE_STATUS_COMPLETED, weight_version=0)
    for k, v in fields.items():
        if k == "routed_experts":
            msg.routed_experts.CopyFrom(v)
        else:
            setattr(msg, k, v)
    return msg


def _experts(top: int) -> sample_pb2.RoutedExperts:
    ids: np.ndarray = np.full((4, 1, 2), top, dtype=np.uint8)
    return sample_pb2.RoutedExperts(num_layers=1, top_k=2, bits=8, ids=ids.tobytes())


POISON: dict[str, dict[str, object]] = {
    "response_ids": {"response_ids": np.array([1, 2, VOCAB + 5, 3], "<i4").tobytes()},     # outside the vocabulary
    "prompt_ids": {"prompt_ids": np.array([1, -7, 2], "<i4").tobytes()},                    # negative id
    "weight_version": {"weight_version": 2**64 - 1},
    "loss_mask": {"loss_mask": np.array([1, 200, 1, 0], "u1").tobytes()},
    "rollout_logprobs": {"rollout_logprobs": np.array([-0.1, 50.0, -0.2, -0.3], "<f4").tobytes()},
    "token_versions": {"token_versions": np.array([0, 0, 9, 0], "<i4").tobytes()},
    "routed_experts": {"routed_experts": _experts(EXPERTS + 3)},
}


@pytest.fixture(scope="module")
def pki() -> RunPki:
    return make_pki()


@pytest.fixture(params=[64])
def buffer(request: pytest.FixtureRequest, tmp_path: Path, pki: RunPki) -> Iterator[tuple[str, BufferCore]]:
    settings = BufferSettings(capacity=request.param, group_size=2, groups_per_step=1, steps=100, max_staleness=100,
                              lease_seconds=60.0, min_valid_per_group=1)
    core = BufferCore(EmbeddedStore(tmp_path / "buffer", fsync="always"), settings,
                      limits=SampleLimits(vocab_size=VOCAB, num_experts=EXPERTS), version_lead=1)
    server: Server = start_server(core, "127.0.0.1:0", pki.good["buffer"])
    yield f"127.0.0.1:{server.port}", core
    server.stop(0)
    core.close()


def _code(fn: object, *args: object, **kw: object) -> tuple[grpc.StatusCode, str]:
    try:
        fn(*args, **kw)  # type: ignore[operator]
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def test_poison_samples_are_refused_naming_the_field(buffer: tuple[str, BufferCore], pki: RunPki) -> None:
    address, core = buffer
    with channel(address, pki.good["rollout"]) as ch:
        stub = buffer_pb2_grpc.BufferStub(ch)
        tickets = stub.Claim(buffer_pb2.ClaimRequest(replica_id="rollout-0", max_groups=1), timeout=5).tickets
        gid = tickets[0].group_id
        for field, bad in POISON.items():
            code, details = _code(stub.Put, buffer_pb2.PutRequest(samples=[sample(gid, 0, **bad)]), timeout=5)
            assert code == grpc.StatusCode.INVALID_ARGUMENT and field in details, (field, code, details)
        assert core.stats().put_samples == 0                     # nothing of a refused call was stored
        ok = stub.Put(buffer_pb2.PutRequest(samples=[sample(gid, 0), sample(gid, 1)]), timeout=5)
        assert ok.accepted == 2


def test_steps_and_versions_out_of_bounds_are_refused(buffer: tuple[str, BufferCore], pki: RunPki) -> None:
    address, _ = buffer
    with channel(address, pki.good["trainer"]) as ch:
        stub = buffer_pb2_grpc.BufferStub(ch)
        code, details = _code(stub.Ack, buffer_pb2.AckRequest(committed_step=2**64 - 1), timeout=5)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "committed_step" in details, details
        code, details = _code(stub.GetBatch, buffer_pb2.GetBatchRequest(step=0, policy_version=2**63), timeout=5)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "policy_version" in details, details
        assert stub.Stats(buffer_pb2.StatsRequest(), timeout=5).finished is False     # the run was not ended


@pytest.mark.parametrize("buffer", [4], indirect=True)
def test_long_polls_leave_threads_for_the_trainer(buffer: tuple[str, BufferCore], pki: RunPki) -> None:
    """200 Claims that wait (capacity 4: two groups in flight, then every Claim waits for room): GetBatch and Stats
    still answer at once, and the caller's cap refuses what it cannot hold."""
    address, _ = buffer
    with channel(address, pki.good["rollout"]) as rch, channel(address, pki.good["trainer"]) as tch:
        rollout = buffer_pb2_grpc.BufferStub(rch)
        first = rollout.Claim(buffer_pb2.ClaimRequest(replica_id="rollout-0", max_groups=64), timeout=5)
        assert len(first.tickets) == 2                                   # capacity 4: the rest must wait
        codes: list[grpc.StatusCode] = []
        calls = [rollout.Claim.future(buffer_pb2.ClaimRequest(replica_id="rollout-0", max_groups=1, wait_seconds=3),
                                      timeout=6) for _ in range(200)]
        time.sleep(1.0)
        trainer = buffer_pb2_grpc.BufferStub(tch)
        t0 = time.monotonic()
        trainer.Stats(buffer_pb2.StatsRequest(), timeout=5)
        trainer.GetBatch(buffer_pb2.GetBatchRequest(step=0, policy_version=0, wait_seconds=0), timeout=5)
        answered = time.monotonic() - t0
        lock = threading.Lock()
        for c in calls:
            try:
                reply = c.result()
                assert not reply.tickets and reply.reason.startswith("capacity")       # waited, then timed out
                code = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                code = exc.code()
            with lock:
                codes.append(code)
        assert answered < 2.0, answered                           # not queued behind the waits (bench: the figure)
        assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) > 0   # the caller's cap refused most at once
