"""One commit of the Redis store as the commands of one MULTI/EXEC pipeline.

Commands are coalesced so a commit costs one round trip and few commands: the samples of a Put are one XADD each
(their ids are their seqs), ticket writes are one HSET, every sample that leaves the store is in one XDEL, and every
counter that changed is written as its new absolute value in one HSET of `meta` (the buffer is the single writer and
its State mirrors Redis, so `state` + these mutations is exactly what Redis will hold after EXEC). Commands on the
`ready` stream keep their order: a Stale XDEL must precede the XREADGROUP of a Deliver in the same commit.
"""

from __future__ import annotations

import json
from typing import Any

from rlfleet.services.buffer.mutations import (
    AckSteps,
    Add,
    Cancel,
    Close,
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
from rlfleet.services.buffer.state import State

GROUP = b"trainer"
CONSUMER = b"buffer"


def sid(seq: int) -> str:
    return f"0-{seq}"


class CommitBuilder:
    """Queues the commands for a list of mutations on pipe; `checks` names each XREADGROUP reply to verify."""

    def __init__(self, pipe: Any, keys: dict[str, str], state: State) -> None:
        self.pipe, self.k, self.state = pipe, keys, state
        self.checks: list[tuple[int, tuple[int, ...]]] = []
        self.meta: dict[str, Any] = {}
        self.tickets: dict[str, str] = {}
        self.gone: list[str] = []                      # sample entries that leave the store
        self.dropped: dict[str, int] = {}
        self.cancelled: dict[str, dict[str, Any]] = {}      # cancelled-group records written by this commit

    def queue(self, mutations: list[Mutation]) -> None:
        st, meta = self.state, self.meta
        cursor, seq, put = st.next_prompt_index, st.seq, st.put_samples
        acked, acked_groups, committed = st.acked_samples, st.acked_groups, st.committed_step
        cancelled_groups = st.cancelled_groups
        for m in mutations:
            if isinstance(m, Add):
                seq = max(seq, m.seq)
                put += 1
                self.pipe.xadd(self.k["samples"], {"g": m.gid, "i": m.index, "v": m.weight_version, "s": m.status,
                                                   "r": repr(m.reward), "d": m.data}, id=sid(m.seq))
            elif isinstance(m, Issue):
                cursor = max(cursor, m.prompt_index + 1)
                self.tickets[m.gid] = json.dumps({"p": m.prompt_index, "n": m.group_size, "d": m.deadline,
                                                  "r": m.replica, "v": m.version})
            elif isinstance(m, Close):
                seq = max(seq, m.seq)
                self._close(m)
            elif isinstance(m, Stale):
                if m.ready_seqs:
                    self.pipe.xdel(self.k["ready"], *map(sid, m.ready_seqs))
                self._drop(m.sample_seqs, {m.reason: m.samples})
            elif isinstance(m, Cancel):
                self._cancel(m)
                cancelled_groups += 1
                meta["cancelled_groups"] = cancelled_groups
            elif isinstance(m, Discard):
                rec = self._record(m.gid)
                rec["i"] = sorted({*rec["i"], *m.indices})
                self._drop((), {"aborted": len(m.indices)})
            elif isinstance(m, Refuse):
                self._drop((), {m.reason: m.samples})
            elif isinstance(m, Forget):
                for gid in m.gids:
                    self.cancelled.pop(gid, None)
                self.pipe.hdel(self.k["cancelled"], *m.gids)
            elif isinstance(m, Deliver):
                self.checks.append((len(self.pipe), m.ready_seqs))
                self.pipe.xreadgroup(GROUP, CONSUMER, {self.k["ready"]: ">"}, count=len(m.ready_seqs))
                self.pipe.hset(self.k["batches"], m.step, json.dumps({"gids": m.gids, "ready_seqs": m.ready_seqs}))
            elif isinstance(m, AckSteps):
                if m.ready_seqs:
                    ids = list(map(sid, m.ready_seqs))
                    self.pipe.xack(self.k["ready"], GROUP, *ids)
                    self.pipe.xdel(self.k["ready"], *ids)
                self.gone.extend(map(sid, m.sample_seqs))
                if m.steps:
                    self.pipe.hdel(self.k["batches"], *m.steps)
                acked, acked_groups = acked + m.samples, acked_groups + m.groups
                committed = max(committed, m.committed_step)
                meta.update(acked=acked, acked_groups=acked_groups, committed_step=committed)
            elif isinstance(m, Quarantine):
                seq = max(seq, *m.requeue_seqs, 0)
                self._quarantine(m)
            elif isinstance(m, Policy):
                meta["policy"] = m.version
            else:
                raise TypeError(f"redis store cannot commit {m!r}")
        if cursor != st.next_prompt_index:
            meta["cursor"] = cursor
        if put != st.put_samples:
            meta["put"] = put
        meta["seq"] = seq
        meta.update({f"dropped:{r}": st.dropped.get(r, 0) + n for r, n in self.dropped.items()})
        self._flush_tickets()
        if self.cancelled:
            self.pipe.hset(self.k["cancelled"], mapping={gid: json.dumps(rec) for gid, rec in self.cancelled.items()})
        if self.gone:
            self.pipe.xdel(self.k["samples"], *self.gone)
        self.pipe.hset(self.k["meta"], mapping=meta)

    def _close(self, m: Close) -> None:
        g = self.state.open[m.gid]
        self.tickets.pop(m.gid, None)
        self.pipe.hdel(self.k["open"], m.gid)
        if m.kept:
            self.pipe.xadd(self.k["ready"], {"g": m.gid, "k": ",".join(map(str, m.kept)), "p": g.prompt_index,
                                             "n": g.group_size}, id=sid(m.seq))
        self._drop(m.drop_seqs, m.drops)

    def _cancel(self, m: Cancel) -> None:
        g = self.state.open[m.gid]
        self.tickets.pop(m.gid, None)
        self.pipe.hdel(self.k["open"], m.gid)
        self.cancelled[m.gid] = {"p": g.prompt_index, "n": g.group_size, "r": g.replica, "u": m.until,
                                 "i": list(m.indices)}
        self._drop(m.sample_seqs, {m.reason: len(m.sample_seqs)})

    def _quarantine(self, m: Quarantine) -> None:
        """The quarantined groups' ready entries and samples leave and each gets a record in `quarantine`; the
        batch's other groups leave their (pending) ready entries and are added again at the end of the stream."""
        moved = [self.state.delivered[gid] for gid in m.requeue]
        old = [*m.ready_seqs, *(g.ready_seq for g in moved)]
        if old:
            ids = list(map(sid, old))
            self.pipe.xack(self.k["ready"], GROUP, *ids)
            self.pipe.xdel(self.k["ready"], *ids)
        for g, seq in zip(moved, m.requeue_seqs, strict=True):
            self.pipe.xadd(self.k["ready"], {"g": g.gid, "k": ",".join(map(str, g.kept)), "p": g.prompt_index,
                                             "n": g.group_size}, id=sid(seq))
        self.pipe.hdel(self.k["batches"], m.step)
        if m.gids:
            record = json.dumps({"s": m.step, "r": m.reason})
            self.pipe.hset(self.k["quarantine"], mapping=dict.fromkeys(m.gids, record))
        self._drop(m.sample_seqs, {"quarantined": m.samples})

    def _record(self, gid: str) -> dict[str, Any]:
        """The cancelled-group record as this commit leaves it (from the state when this commit has not touched it)."""
        if gid not in self.cancelled:
            c = self.state.cancelled[gid]
            self.cancelled[gid] = {"p": c.prompt_index, "n": c.group_size, "r": c.replica, "u": c.until,
                                   "i": sorted(c.counted)}
        return self.cancelled[gid]

    def _drop(self, seqs: tuple[int, ...], drops: dict[str, int]) -> None:
        self.gone.extend(map(sid, seqs))
        for reason, n in drops.items():
            if n:
                self.dropped[reason] = self.dropped.get(reason, 0) + n

    def _flush_tickets(self) -> None:
        if self.tickets:
            self.pipe.hset(self.k["open"], mapping=self.tickets)
            self.tickets = {}
