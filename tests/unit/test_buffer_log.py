"""The embedded store's log: checksummed records, torn-tail repair, compaction; mutation records; filters."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.services.buffer.filters import dynamic_sampling, load_filters
from rlfleet.services.buffer.mutations import AckSteps, Add, Close, Counters, Deliver, Issue, Mutation, decode, encode
from rlfleet.services.buffer.state import State
from rlfleet.services.buffer.stores.embedded import LOG_NAME, EmbeddedStore, LogCorrupt
from rlfleet.services.buffer.stores.logfile import read_records


def fill(store: EmbeddedStore, groups: int) -> State:
    state = store.load()
    for g in range(groups):
        gid = f"g{g}"
        muts: list[Mutation] = [Issue(gid, g, 2, 1e9, "r"), Add(gid, 0, 3 * g + 1, 0, 1, 0.0, b"a" * 100),
                Add(gid, 1, 3 * g + 2, 0, 1, 1.0, b"b" * 100), Close(gid, (0, 1), 3 * g + 3, {}, ())]
        store.commit(muts, state)
        for m in muts:
            state.apply(m)
    return state


def summary(state: State) -> tuple:
    return (list(state.ready), state.next_prompt_index, state.seq, state.put_samples,
            [e.data for g in state.ready.values() for e in g.entries()])


def test_mutations_round_trip() -> None:
    for m in (Issue("g1", 1, 4, 12.5, "r"), Add("g1", 2, 7, 3, 1, -0.25, b"\x00\xff"),
              Close("g1", (0, 2), 9, {"failed": 1}, (5,)), Deliver(3, ("g1",), (9,)),
              Counters(1, 2, 3, 4, 5, 6, 7, {"stale": 8})):
        assert decode(*encode(m)) == m


def test_replay_rebuilds_state(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path, fsync="always")
    before = summary(fill(store, 3))
    store.close()
    assert summary(EmbeddedStore(tmp_path).load()) == before


@pytest.mark.parametrize("damage", ["torn", "flipped"])
def test_a_torn_last_record_is_cut_off_and_a_flipped_one_refused(tmp_path: Path, damage: str) -> None:
    """A torn last commit (a write that did not finish, never acknowledged) is cut; a complete last commit with a
    flipped bit may be an acknowledged one: refused, naming the offset, and nothing is cut."""
    store = EmbeddedStore(tmp_path, fsync="no")
    fill(store, 2)
    store.close()
    path = tmp_path / LOG_NAME
    good = path.read_bytes()
    store = EmbeddedStore(tmp_path, fsync="no")
    fill_state = store.load()
    store.commit([Issue("g9", 9, 2, 1e9, "r")], fill_state)
    store.close()
    data = path.read_bytes()
    assert len(data) > len(good)
    if damage == "flipped":
        path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        with pytest.raises(LogCorrupt, match=rf"corrupt last frame at offset {len(good)} \(a flipped bit at offset "
                                             rf"{len(data) - 1} "):
            EmbeddedStore(tmp_path).load()
        assert path.read_bytes() == data[:-1] + bytes([data[-1] ^ 1])     # nothing cut
        return
    path.write_bytes(data[:-3])
    store = EmbeddedStore(tmp_path)
    state = store.load()
    assert "g9" not in state.open and list(state.ready) == ["g0", "g1"]
    assert path.stat().st_size == len(good)             # cut off, so later appends are readable
    assert (tmp_path / f"{LOG_NAME}.torn-0").read_bytes() == data[len(good):-3]     # the cut bytes are kept
    store.commit([Issue("g2", 2, 2, 1e9, "r")], state)
    store.close()
    assert "g2" in EmbeddedStore(tmp_path).load().open


def test_compaction_keeps_the_state_and_shrinks_the_log(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path, fsync="everysec", compact_min_bytes=1 << 30)
    state = fill(store, 6)
    gids = list(state.ready)
    for step, gid in enumerate(gids[:5]):                # deliver most groups, commit all but the last batch
        m = Deliver(step, (gid,), (state.ready[gid].ready_seq,))
        store.commit([m], state)
        state.apply(m)
    acked = [e.seq for gid in gids[:4] for e in state.delivered[gid].entries()]
    ack = AckSteps(3, (0, 1, 2, 3), (), tuple(acked), len(acked), 4)
    store.commit([ack], state)
    state.apply(ack)
    size_before = (tmp_path / LOG_NAME).stat().st_size
    store.compact(state)
    assert (tmp_path / LOG_NAME).stat().st_size < size_before / 2
    store.close()
    again = EmbeddedStore(tmp_path).load()
    assert summary(again) == summary(state) and sorted(again.batches) == [4]
    assert (again.acked_groups, again.committed_step, list(again.delivered)) == (4, 3, [gids[4]])


def test_compaction_runs_by_itself(tmp_path: Path) -> None:
    store = EmbeddedStore(tmp_path, fsync="no", compact_min_bytes=1)
    state = fill(store, 4)
    for step, gid in enumerate(list(state.ready)):
        seqs = tuple(e.seq for e in state.ready[gid].entries())
        for m in (Deliver(step, (gid,), (state.ready[gid].ready_seq,)), AckSteps(step, (step,), (), seqs, 2, 1)):
            store.commit([m], state)
            state.apply(m)
    store.commit([Issue("g4", 4, 2, 1e9, "r")], state)
    assert len(read_records(tmp_path / LOG_NAME)[0]) < 12     # 25 records were written
    state.apply(Issue("g4", 4, 2, 1e9, "r"))
    store.close()
    again = EmbeddedStore(tmp_path).load()
    assert summary(again) == summary(state) and list(again.open) == ["g4"] and again.acked_samples == 8


def test_fsync_policy_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fsync"):
        EmbeddedStore(tmp_path, fsync="sometimes")


def test_dynamic_sampling() -> None:
    class S:
        def __init__(self, reward: float) -> None:
            self.reward = reward

    assert dynamic_sampling([S(1.0), S(1.0)]) is not None
    assert dynamic_sampling([S(1.0), S(0.0)]) is None
    assert [f.name for f in load_filters(["dynamic_sampling"])] == ["dynamic_sampling"]
    with pytest.raises(ValueError, match="buffer.filters"):
        load_filters(["no_such_module_xyz:f"])


def test_one_writer_per_log(tmp_path: Path) -> None:
    first = EmbeddedStore(tmp_path)
    first.load()
    with pytest.raises(RuntimeError, match="in use"):
        EmbeddedStore(tmp_path).load()
    first.close()
    EmbeddedStore(tmp_path).load()


def test_cancelled_groups_survive_replay_and_compaction(tmp_path: Path) -> None:
    from rlfleet.services.buffer.mutations import Cancel, Discard, Forget, Stale

    for m in (Issue("g1", 1, 4, 12.5, "r", 3), Cancel("g1", 99.0, (0, 2), (5, 6)), Discard("g1", (1,)),
              Forget(("g1",)), Stale(("g2",), (4,), (1, 2), 2, "aborted"), Counters(1, 2, 3, 4, 5, 6, 7, {}, 9)):
        assert decode(*encode(m)) == m
    store = EmbeddedStore(tmp_path, fsync="always")
    state = store.load()
    muts: list[Mutation] = [Issue("g0", 0, 2, 1e9, "r0", 1), Add("g0", 0, 1, 1, 1, 0.0, b"a"),
                            Issue("g1", 1, 2, 1e9, "r1", 1), Cancel("g0", 5e9, (0,), (1,)), Discard("g0", (1,))]
    store.commit(muts, state)
    for mut in muts:
        state.apply(mut)
    assert state.cancelled["g0"].counted == {0, 1} and state.open["g1"].version == 1

    def view(s: State) -> tuple:
        c = s.cancelled["g0"]
        return (c.replica, c.until, c.counted, s.cancelled_groups, s.dropped, s.stored_samples(), list(s.open))

    assert view(state) == ("r0", 5e9, {0, 1}, 1, {"aborted": 2}, 0, ["g1"])
    store.close()
    store = EmbeddedStore(tmp_path, fsync="always")
    replayed = store.load()
    assert view(replayed) == view(state)
    store.compact(replayed)
    store.close()
    assert view(EmbeddedStore(tmp_path).load()) == view(state)
