"""Sorting the samples of one Put against the buffer's state: those of cancelled groups, repeats, samples under a
superseded lease, and the mutations that store the rest (closing the groups they complete). Pure functions of the
state; BufferCore.put commits what they return."""

from __future__ import annotations

from collections.abc import Sequence

from rlfleet.services.buffer.errors import InvalidSample, UnknownGroup
from rlfleet.services.buffer.filters import GroupFilter
from rlfleet.services.buffer.grouping import close_group
from rlfleet.services.buffer.mutations import Add, Discard, Mutation
from rlfleet.services.buffer.state import Entry, State, prompt_of
from rlfleet.v1 import sample_pb2


def split_cancelled(state: State, pairs: list[tuple[sample_pb2.Sample, bytes]]
                    ) -> tuple[list[tuple[sample_pb2.Sample, bytes]], list[Discard], int]:
    """(the samples of other groups, Discards for new indices of cancelled groups, repeats of counted ones)."""
    cancelled = state.cancelled
    rest: list = []
    repeats = 0
    new: dict = {}
    for msg, raw in pairs:
        c = cancelled.get(msg.group_id)
        if c is None:
            rest.append((msg, raw))
            continue
        mine = new.setdefault(msg.group_id, [])
        if msg.index in c.counted or msg.index in mine or msg.index >= c.group_size:
            repeats += 1
        else:
            mine.append(msg.index)
    return rest, [Discard(gid, tuple(ix)) for gid, ix in new.items() if ix], repeats

def classify(state: State, pairs: list[tuple[sample_pb2.Sample, bytes]]
             ) -> tuple[list[tuple[sample_pb2.Sample, bytes]], int, list[tuple[sample_pb2.Sample, bytes]]]:
    """(samples to store, duplicates, samples put by a replica whose lease on the group was re-issued to
    another: the group's ticket names its current holder, and only the holder's samples are stored)."""
    st, fresh, seen, dups, late = state, [], set(), 0, []
    for msg, raw in pairs:
        g = st.open.get(msg.group_id)
        if g is not None and msg.replica_id and g.replica and msg.replica_id != g.replica:
            late.append((msg, raw))
            continue
        if g is None:
            p = prompt_of(msg.group_id)
            if st.group(msg.group_id) is None and (p is None or p >= st.next_prompt_index):
                raise UnknownGroup(f"group {msg.group_id!r} was never issued by Claim")
            dups += 1          # ready, delivered, committed or dropped: a late or repeated put
            continue
        if msg.group_size != g.group_size or msg.prompt_index != g.prompt_index:
            raise InvalidSample(f"sample {msg.group_id}/{msg.index} says group_size {msg.group_size}, prompt "
                                f"{msg.prompt_index}; the ticket says {g.group_size}, {g.prompt_index}")
        key = (msg.group_id, msg.index)
        if msg.index in g.samples or key in seen:
            dups += 1
            continue
        seen.add(key)
        fresh.append((msg, raw))
    return fresh, dups, late

def put_mutations(state: State, fresh: list[tuple[sample_pb2.Sample, bytes]], min_valid_per_group: int,
                  filters: Sequence[GroupFilter]) -> list[Mutation]:
    """Add mutations for `fresh` samples, then a close for every group they complete."""
    seq = state.seq
    adds: dict[str, dict[int, Entry]] = {}
    muts: list[Mutation] = []
    for msg, raw in fresh:
        seq += 1
        muts.append(Add(msg.group_id, msg.index, seq, msg.weight_version, msg.status, msg.reward, raw))
        adds.setdefault(msg.group_id, {})[msg.index] = Entry(seq, msg.index, msg.weight_version, msg.status,
                                                             msg.reward, raw)
    for gid, new in adds.items():
        g = state.open[gid]
        entries = {**g.samples, **new}
        if len(entries) == g.group_size:
            seq += 1
            muts.append(close_group(g, entries, seq, min_valid_per_group, filters))
    return muts
