"""The buffer's cheaper per-sample path: the Ack folded into GetBatch (GetBatchRequest.ack_through_step) commits
exactly what Ack does, and a Put framed from serialized samples (rlfleet.sample.put_wire) is acknowledged only once
durable.

On the core of both stores it leaves the same state as GetBatch + Ack, through a restart; on the real buffer process
over gRPC it survives kill -9: the acked groups are gone, the next step's batch stays delivered, re-asking for a step
re-delivers the same bytes, and bad values are refused naming the field with nothing changed. Every sample a framed
Put acknowledged is there after kill -9 right after the reply, byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis

from rlfleet.runtime.rpc import channel
from rlfleet.sample.put_wire import encode_put_request, raw_put
from rlfleet.services.buffer.core import BufferCore
from rlfleet.services.buffer.errors import InvalidRequest
from rlfleet.v1 import buffer_pb2
from tests.integration import test_buffer_contract as contract
from tests.integration.test_buffer_contract import Factory, claim_one, group
from tests.integration.test_buffer_service import TOKEN, BufferProcess, write_config
from tests.support.redis_server import free_port

make_core = contract.make_core            # the contract tests' fixtures: a core on each store, one redis-server
redis_server = contract.redis_server


def _fill(core: BufferCore, groups: int) -> list[str]:
    gids = [claim_one(core) for _ in range(groups)]
    for gid in gids:
        core.put(group(gid, 2), 0)
    return gids


def _view(core: BufferCore) -> tuple:
    s = core.stats()
    st = core.state
    return (s.acked_samples, s.stored_samples, s.delivered_unacked, s.ready_groups, dict(s.dropped),
            st.committed_step, {k: list(b.gids) for k, b in st.batches.items()}, sorted(st.delivered))


def test_folded_ack_leaves_the_state_a_separate_ack_leaves(make_core: Factory) -> None:
    core = make_core()
    gids = _fill(core, 4)
    core.get_batch(0, 1, 0, 0)
    core.get_batch(1, 1, 0, 0)
    folded = core.get_batch(2, 1, 0, 0, ack_through=1)       # acks steps 0 and 1, delivers step 2
    assert folded.group_ids == [gids[2]] and not folded.redelivered and folded.acked == 4
    after_fold = _view(core)
    assert after_fold == (4, 2, 2, 1, {}, 1, {2: [gids[2]]}, [gids[2]])
    again = core.get_batch(2, 1, 0, 0, ack_through=1)         # a retried call: same batch, nothing acked twice
    assert again.redelivered and again.samples == folded.samples and again.acked == 0
    core = make_core()                                        # buffer restart: the folded ack was committed
    assert _view(core) == after_fold
    assert core.get_batch(2, 1, 0, 0).samples == folded.samples
    assert core.get_batch(3, 1, 0, 0, ack_through=2).group_ids == [gids[3]]


def test_separate_ack_reference(make_core: Factory) -> None:
    """The same sequence with Ack calls: the state test_folded_ack_... expects (hand-checked, same tuple)."""
    core = make_core()
    gids = _fill(core, 4)
    core.get_batch(0, 1, 0, 0)
    core.get_batch(1, 1, 0, 0)
    assert core.ack(1) == 4
    core.get_batch(2, 1, 0, 0)
    assert _view(core) == (4, 2, 2, 1, {}, 1, {2: [gids[2]]}, [gids[2]])


def test_folded_ack_refuses_bad_steps_and_changes_nothing(make_core: Factory) -> None:
    core = make_core()
    _fill(core, 2)
    core.get_batch(0, 1, 0, 0)
    before = _view(core)
    with pytest.raises(InvalidRequest, match="ack_through_step 1 must be before"):
        core.get_batch(1, 1, 0, 0, ack_through=1)
    with pytest.raises(InvalidRequest, match="past the last delivered step 0"):
        core.get_batch(3, 1, 0, 0, ack_through=2)
    assert _view(core) == before


@pytest.fixture(params=["embedded", "redis"])
def buffer_process(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BufferProcess]:
    extra: dict[str, object] = {}
    if request.param == "redis":
        url = request.getfixturevalue("redis_server").url
        redis.Redis.from_url(url).flushall()      # the module's redis-server: every buffer here has the same run name
        extra = {"store": "redis", "redis_url": url}
    port = free_port()
    proc = BufferProcess(write_config(tmp_path / "run", port, **extra), port).start()
    yield proc
    if proc.proc is not None and proc.proc.poll() is None:
        proc.kill9()


def test_framed_puts_and_folded_acks_survive_kill9(buffer_process: BufferProcess) -> None:
    stub, put = buffer_process.stub(), raw_put(channel(buffer_process.address, TOKEN))
    tickets = stub.Claim(buffer_pb2.ClaimRequest(replica_id="r", max_groups=3), timeout=10).tickets
    sent = {t.group_id: [m.SerializeToString() for m in group(t.group_id, 2)] for t in tickets}
    first, second, third = (t.group_id for t in tickets)
    reply = put(encode_put_request(sent[first] + sent[second], 1.0), timeout=10)     # two groups in one Put
    assert (reply.accepted, reply.duplicates) == (4, 0)
    assert put(encode_put_request(sent[third][:1], 1.0), timeout=10).accepted == 1    # half a group

    def get(step: int, ack: int | None = None) -> buffer_pb2.Batch:
        req = buffer_pb2.GetBatchRequest(step=step, num_groups=1, wait_seconds=5)
        if ack is not None:
            req.ack_through_step = ack
        return stub.GetBatch(req, timeout=10)

    got = get(0)
    assert list(got.group_ids) == [first] and [m.SerializeToString() for m in got.samples] == sent[first]
    second_batch = get(1, ack=0)
    assert list(second_batch.group_ids) == [second] and second_batch.acked_samples == 2
    assert not second_batch.redelivered
    with pytest.raises(grpc.RpcError) as bad:
        get(2, ack=2)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "ack_through_step" in bad.value.details()

    buffer_process.kill9()          # at once after the replies: what they acknowledged must already be durable
    buffer_process.start()
    stub, put = buffer_process.stub(), raw_put(channel(buffer_process.address, TOKEN))
    s = stub.Stats(buffer_pb2.StatsRequest(), timeout=10)
    assert (s.put_samples, s.acked_samples, s.delivered_unacked, s.partial_groups, s.ready_groups) == (5, 2, 2, 1, 0)
    with pytest.raises(grpc.RpcError) as gone:
        get(0)
    assert gone.value.code() == grpc.StatusCode.FAILED_PRECONDITION          # step 0 is committed: its group gone
    again = get(1, ack=0)
    assert again.redelivered and again.acked_samples == 0
    assert [m.SerializeToString() for m in again.samples] == sent[second]
    reply = put(encode_put_request(sent[third], 1.0), timeout=10)
    assert (reply.accepted, reply.duplicates) == (1, 1)                      # the acknowledged half was kept
    third_batch = get(2, ack=1)
    assert list(third_batch.group_ids) == [third] and third_batch.acked_samples == 2
    assert [m.SerializeToString() for m in third_batch.samples] == sent[third]
    assert stub.Ack(buffer_pb2.AckRequest(committed_step=2), timeout=10).acked_samples == 2    # the last step: Ack
    s = stub.Stats(buffer_pb2.StatsRequest(), timeout=10)
    assert (s.acked_samples, s.delivered_unacked, s.stored_samples) == (6, 0, 0)
