"""A replica acts only as itself on the buffer: real gRPC over mTLS with two rollout identities (rollout-0, the
victim, and rollout-1). Put refuses samples whose replica_id is empty or another replica's, so no replica can fill
another's group and make the victim's own samples count as duplicates; Claim takes at most the caller's fair share
of the tickets, and refuses a weight version past the newest the trainer reported (+ security.version_lead)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from rlfleet.runtime.rpc import Server, channel
from rlfleet.sample.limits import SampleLimits
from rlfleet.security.identity import Identity
from rlfleet.security.pki import issue
from rlfleet.services.buffer.core import BufferCore
from rlfleet.services.buffer.server import start_server
from rlfleet.services.buffer.settings import BufferSettings
from rlfleet.services.buffer.stores.embedded import EmbeddedStore
from rlfleet.v1 import buffer_pb2, buffer_pb2_grpc, sample_pb2
from tests.security.pki_fixtures import make_pki

GROUPS_PER_STEP = 4


@pytest.fixture()
def buffer(tmp_path: Path) -> Iterator[dict[str, buffer_pb2_grpc.BufferStub]]:
    pki = make_pki()
    other = issue(pki.ca, "rollout", "rollout-1")
    attacker = Identity(role="rollout", name="rollout-1", key_pem=other.key_pem, cert_pem=other.cert_pem,
                        ca_pem=pki.ca.cert_pem)
    settings = BufferSettings(capacity=64, group_size=2, groups_per_step=GROUPS_PER_STEP, steps=10, max_staleness=0,
                              lease_seconds=60.0, min_valid_per_group=1, replicas=2, claim_groups=1)
    core = BufferCore(EmbeddedStore(tmp_path / "buffer", fsync="no"), settings, limits=SampleLimits(vocab_size=100),
                      version_lead=1)
    server: Server = start_server(core, "127.0.0.1:0", pki.good["buffer"])
    addr = f"127.0.0.1:{server.port}"
    chans = {"victim": channel(addr, pki.good["rollout"]), "attacker": channel(addr, attacker),
             "trainer": channel(addr, pki.good["trainer"])}
    yield {who: buffer_pb2_grpc.BufferStub(ch) for who, ch in chans.items()}
    for ch in chans.values():
        ch.close()
    server.stop(0)


def _sample(ticket: buffer_pb2.GroupTicket, index: int, replica_id: str) -> sample_pb2.Sample:
    return sample_pb2.Sample(run_id="r", group_id=ticket.group_id, index=index, group_size=ticket.group_size,
                             prompt_index=ticket.prompt_index, prompt_ids=np.asarray([1, 2], "<i4").tobytes(),
                             response_ids=np.asarray([3], "<i4").tobytes(),
                             rollout_logprobs=np.asarray([-0.5], "<f4").tobytes(), loss_mask=b"\x01",
                             status=sample_pb2.SAMPLE_STATUS_COMPLETED, reward=1.0, replica_id=replica_id)


def _code(call: object) -> grpc.StatusCode:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_a_replica_cannot_put_into_another_replicas_group(buffer: dict[str, buffer_pb2_grpc.BufferStub]) -> None:
    ticket = buffer["victim"].Claim(buffer_pb2.ClaimRequest(replica_id="rollout-0", max_groups=1), timeout=10
                                    ).tickets[0]
    for forged in ("", "rollout-0"):          # empty: the buffer skipped its holder check; foreign: impersonation
        got = _code(lambda f=forged: buffer["attacker"].Put(buffer_pb2.PutRequest(samples=[_sample(ticket, 0, f)]),
                                                            timeout=10))
        assert got == grpc.StatusCode.PERMISSION_DENIED, forged
    assert _code(lambda: buffer["victim"].Put(buffer_pb2.PutRequest(samples=[_sample(ticket, 0, "")]),
                                              timeout=10)) == grpc.StatusCode.PERMISSION_DENIED
    reply = buffer["victim"].Put(buffer_pb2.PutRequest(samples=[_sample(ticket, i, "rollout-0") for i in range(2)]),
                                 timeout=10)
    assert list(reply.outcomes) == [buffer_pb2.PUT_ACCEPTED] * 2          # the victim's samples, not duplicates
    batch = buffer["trainer"].GetBatch(buffer_pb2.GetBatchRequest(step=0, num_groups=1, wait_seconds=0), timeout=10)
    assert [s.replica_id for s in batch.samples] == ["rollout-0", "rollout-0"]


def test_claim_takes_at_most_the_callers_fair_share(buffer: dict[str, buffer_pb2_grpc.BufferStub]) -> None:
    """2 replicas, 4 groups a step, synchronous: a replica may hold ceil(4 / 2) = 2 tickets (>= claim_groups 1)."""
    greedy = buffer["attacker"].Claim(buffer_pb2.ClaimRequest(replica_id="rollout-1", max_groups=2**32 - 1),
                                      timeout=10)
    assert len(greedy.tickets) == 2
    again = buffer["attacker"].Claim(buffer_pb2.ClaimRequest(replica_id="rollout-1", max_groups=2**32 - 1),
                                     timeout=10)
    assert len(again.tickets) == 0 and again.reason.startswith("fair share")
    fair = buffer["victim"].Claim(buffer_pb2.ClaimRequest(replica_id="rollout-0", max_groups=8), timeout=10)
    assert len(fair.tickets) == 2
    assert {t.group_id for t in fair.tickets}.isdisjoint(t.group_id for t in greedy.tickets)


def test_claim_refuses_a_weight_version_past_the_newest(buffer: dict[str, buffer_pb2_grpc.BufferStub]) -> None:
    """Policy version 0 reported, lead 1: version 1 is fine (just published), 2 and 2^63 are not."""
    for version in (2**63, 2):
        got = _code(lambda v=version: buffer["victim"].Claim(
            buffer_pb2.ClaimRequest(replica_id="rollout-0", max_groups=1, weight_version=v), timeout=10))
        assert got == grpc.StatusCode.INVALID_ARGUMENT, version
    ok = buffer["victim"].Claim(buffer_pb2.ClaimRequest(replica_id="rollout-0", max_groups=1, weight_version=1),
                                timeout=10)
    assert len(ok.tickets) == 1
