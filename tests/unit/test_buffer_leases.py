"""Lease epochs: a replica frozen past its lease (SIGSTOP) wakes and puts old-version samples for a group the buffer
has re-issued to a fresh replica. Its late Put must not displace the fresh replica's samples."""

from __future__ import annotations

from pathlib import Path

from rlfleet.services.buffer.core import BufferCore
from rlfleet.services.buffer.settings import BufferSettings
from rlfleet.services.buffer.stores.embedded import EmbeddedStore
from tests.integration.test_buffer_contract import make_sample


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_put_from_an_expired_lease_never_displaces_the_fresh_holder(tmp_path: Path) -> None:
    clock = Clock()
    settings = BufferSettings(capacity=64, group_size=2, groups_per_step=1, steps=10, max_staleness=0,
                              lease_seconds=30.0, min_valid_per_group=1)
    core = BufferCore(EmbeddedStore(tmp_path), settings, clock=clock)
    (t,) = core.claim("frozen", 0, 1, 0).tickets
    core.get_batch(0, 1, 1, 0)                  # the policy moves to version 1 while "frozen" is stopped
    clock.now += 31                             # its lease expires
    (again,) = core.claim("fresh", 1, 1, 0).tickets
    assert again.group_id == t.group_id
    old = [make_sample(t.group_id, i, 2, version=0) for i in range(2)]
    for s in old:
        s.replica_id = "frozen"
    late = core.put(old, 0)                      # the frozen replica wakes first
    assert late.accepted == 0 and not core.state.ready
    new = [make_sample(t.group_id, i, 2, version=1) for i in range(2)]
    for s in new:
        s.replica_id = "fresh"
    assert core.put(new, 0).accepted == 2
    batch = core.get_batch(0, 1, 1, 0)
    assert batch.complete and batch.group_ids == [t.group_id]
    assert core.state.dropped == {"superseded_lease": 2}
    core.close()
    assert BufferCore(EmbeddedStore(tmp_path), settings, clock=clock).state.dropped == {"superseded_lease": 2}
