"""The buffer's state in memory, rebuilt by replaying mutations. Pure data: no I/O, no clock, no locks."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from rlfleet.services.buffer.mutations import (
    AckSteps,
    Add,
    Cancel,
    Close,
    Counters,
    Deliver,
    Discard,
    Forget,
    Issue,
    Mutation,
    Policy,
    Quarantine,
    Refuse,
    Stale,
)


def prompt_of(gid: str) -> int | None:
    """The prompt index a group id names, or None for an id the buffer never issued. Only the form the buffer issues
    is read (`g` and the index in ASCII digits without leading zeros), so `g00`, `g٠` or `g²` never alias `g0`."""
    digits = gid[1:]
    canonical = gid[:1] == "g" and digits.isascii() and digits.isdigit() and (digits == "0" or digits[0] != "0")
    return int(digits) if canonical else None

@dataclass
class Entry:
    """One stored sample: its raw bytes and the few fields the buffer decides on."""

    seq: int
    index: int
    weight_version: int
    status: int
    reward: float
    data: bytes = field(repr=False)


@dataclass
class Group:
    gid: str
    prompt_index: int
    group_size: int
    deadline: float
    replica: str
    version: int = 0                 # weight version of the claim that holds the ticket
    samples: dict[int, Entry] = field(default_factory=dict)
    kept: tuple[int, ...] = ()
    ready_seq: int = 0

    def entries(self) -> list[Entry]:
        """Kept samples ordered by index (a ready or delivered group)."""
        return [self.samples[i] for i in self.kept]


@dataclass
class Cancelled:
    """A group cancelled in flight: remembered until `until` to tell its replica and to drop its late puts."""

    gid: str
    prompt_index: int
    group_size: int
    replica: str
    until: float
    counted: set[int] = field(default_factory=set)     # indices already counted as dropped (aborted)


@dataclass(frozen=True)
class Quarantined:
    """A group the trainer rejected: kept as a record (its samples left the store), never delivered again."""

    gid: str
    step: int
    reason: str


@dataclass
class Batch:
    step: int
    gids: tuple[str, ...]
    ready_seqs: tuple[int, ...]


class State:
    """Open groups (ticketed, filling), ready groups (oldest first), delivered batches, cancelled groups, quarantined
    groups, counters."""

    def __init__(self) -> None:
        self.open: dict[str, Group] = {}
        self.ready: OrderedDict[str, Group] = OrderedDict()
        self.delivered: dict[str, Group] = {}
        self.batches: dict[int, Batch] = {}
        self.cancelled: dict[str, Cancelled] = {}
        self.quarantined: dict[str, Quarantined] = {}
        self.next_prompt_index = 0
        self.seq = 0
        self.put_samples = 0
        self.acked_samples = 0
        self.acked_groups = 0
        self.committed_step = -1
        self.policy_version = 0
        self.dropped: dict[str, int] = {}
        self.cancelled_groups = 0

    # ---- queries -------------------------------------------------------------------------------------------------
    def stored_samples(self) -> int:
        """Samples in the store and not yet delivered (open and ready groups)."""
        return sum(len(g.samples) for g in self.open.values()) + sum(len(g.kept) for g in self.ready.values())

    def group(self, gid: str) -> Group | None:
        return self.open.get(gid) or self.ready.get(gid) or self.delivered.get(gid)

    # ---- replay --------------------------------------------------------------------------------------------------
    def apply(self, m: Mutation) -> None:
        if isinstance(m, Issue):
            g = self.open.get(m.gid)
            if g is None:
                self.open[m.gid] = Group(m.gid, m.prompt_index, m.group_size, m.deadline, m.replica, m.version)
            else:
                g.deadline, g.replica, g.version = m.deadline, m.replica, m.version
            self.next_prompt_index = max(self.next_prompt_index, m.prompt_index + 1)
        elif isinstance(m, Add):
            self.open[m.gid].samples[m.index] = Entry(m.seq, m.index, m.weight_version, m.status, m.reward, m.data)
            self.seq = max(self.seq, m.seq)
            self.put_samples += 1
        elif isinstance(m, Close):
            g = self.open.pop(m.gid)
            self.seq = max(self.seq, m.seq)
            self._count_drops(m.drops)
            if m.kept:
                g.kept, g.ready_seq = m.kept, m.seq
                g.samples = {i: g.samples[i] for i in m.kept}
                self.ready[m.gid] = g
        elif isinstance(m, Stale):
            for gid in m.gids:
                del self.ready[gid]
            self._count_drops({m.reason: m.samples})
        elif isinstance(m, Cancel):
            g = self.open.pop(m.gid)
            self.cancelled[m.gid] = Cancelled(m.gid, g.prompt_index, g.group_size, g.replica, m.until, set(m.indices))
            self.cancelled_groups += 1
            self._count_drops({m.reason: len(m.sample_seqs)})
        elif isinstance(m, Discard):
            self.cancelled[m.gid].counted.update(m.indices)
            self._count_drops({"aborted": len(m.indices)})
        elif isinstance(m, Refuse):
            self._count_drops({m.reason: m.samples})
        elif isinstance(m, Forget):
            for gid in m.gids:
                self.cancelled.pop(gid, None)
        elif isinstance(m, Deliver):
            for gid in m.gids:
                self.delivered[gid] = self.ready.pop(gid)
            self.batches[m.step] = Batch(m.step, m.gids, m.ready_seqs)
        elif isinstance(m, AckSteps):
            for step in m.steps:
                for gid in self.batches.pop(step).gids:
                    del self.delivered[gid]
            self.acked_samples += m.samples
            self.acked_groups += m.groups
            self.committed_step = max(self.committed_step, m.committed_step)
        elif isinstance(m, Quarantine):
            self._quarantine(m)
        elif isinstance(m, Policy):
            self.policy_version = m.version
        elif isinstance(m, Counters):
            self.next_prompt_index, self.seq = m.next_prompt_index, m.seq
            self.put_samples, self.acked_samples, self.acked_groups = m.put_samples, m.acked_samples, m.acked_groups
            self.committed_step, self.policy_version, self.dropped = m.committed_step, m.policy_version, dict(m.dropped)
            self.cancelled_groups = m.cancelled_groups
        else:  # pragma: no cover - a new mutation type without a case here
            raise TypeError(f"unknown mutation {m!r}")

    def _quarantine(self, m: Quarantine) -> None:
        batch = self.batches.get(m.step)
        if batch is not None and set(batch.gids) == {*m.gids, *m.requeue}:      # live (a snapshot has no batch)
            del self.batches[m.step]
            for gid in m.gids:
                del self.delivered[gid]
            for gid, seq in zip(m.requeue, m.requeue_seqs, strict=True):
                g = self.delivered.pop(gid)
                g.ready_seq = seq
                self.ready[gid] = g                       # ready again, newest: its ready entry is re-added last
                self.seq = max(self.seq, seq)
        for gid in m.gids:
            self.quarantined[gid] = Quarantined(gid, m.step, m.reason)
        self._count_drops({"quarantined": m.samples})

    def quarantine_reasons(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for q in self.quarantined.values():
            out[q.reason] = out.get(q.reason, 0) + 1
        return out

    def _count_drops(self, drops: dict[str, int]) -> None:
        for reason, n in drops.items():
            if n:
                self.dropped[reason] = self.dropped.get(reason, 0) + n

    def counters(self) -> Counters:
        return Counters(self.next_prompt_index, self.seq, self.put_samples, self.acked_samples, self.acked_groups,
                        self.committed_step, self.policy_version, dict(self.dropped), self.cancelled_groups)

    def snapshot(self) -> list[Mutation]:
        """Mutations that rebuild this state from empty (compaction); counters last."""
        out: list[Mutation] = []
        groups = [*self.ready.values(), *self.delivered.values(), *self.open.values()]
        for g in groups:
            out.append(Issue(g.gid, g.prompt_index, g.group_size, g.deadline, g.replica, g.version))
            out.extend(Add(g.gid, e.index, e.seq, e.weight_version, e.status, e.reward, e.data)
                       for e in sorted(g.samples.values(), key=lambda e: e.index))
        closed = sorted((g for g in groups if g.ready_seq), key=lambda g: g.ready_seq)
        out.extend(Close(g.gid, g.kept, g.ready_seq, {}, ()) for g in closed)
        records: dict[tuple[int, str], list[str]] = {}         # before the batches: a record never touches one
        for q in self.quarantined.values():
            records.setdefault((q.step, q.reason), []).append(q.gid)
        out.extend(Quarantine(step, tuple(gids), reason) for (step, reason), gids in records.items())
        for b in sorted(self.batches.values(), key=lambda b: b.step):
            out.append(Deliver(b.step, b.gids, b.ready_seqs))
        for c in self.cancelled.values():
            out.append(Issue(c.gid, c.prompt_index, c.group_size, c.until, c.replica))
            out.append(Cancel(c.gid, c.until, tuple(sorted(c.counted)), ()))
        out.append(self.counters())
        return out
