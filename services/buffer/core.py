"""The buffer's decisions: tickets, puts, group completion, batches, acks. Transport-free; one lock.

Every call computes mutations from the current State, commits them to the store (durable), then applies them.
Waiting calls sleep on one condition variable, woken by every change and by the next lease expiry.

Group ids are `g<prompt_index>`, issued from the durable cursor, and an expired ticket is re-issued with the same
id (samples already put for it are kept). So the committed-id set needs no storage of its own: a sample whose group
was issued (index < cursor) but is no longer open (ready, delivered, acked or dropped) is a late or duplicate put and
is ignored; a group never issued is refused.

Over-sampling (settings.over_sample > 1, services.buffer.gate): up to ceil(over_sample * groups_per_step) groups are
issued per step. When a step's batch is delivered, every group still in flight whose claim version is too old for the
next step (or that no step is left for) is cancelled: its ticket ends, its samples drop as `aborted`, and the group is
remembered for lease_seconds so Claim tells its replica (which aborts the engine requests) and its late puts are
dropped as `aborted` too, never stored.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rlfleet.metrics import BufferMetrics
from rlfleet.sample import SampleError, validate_message
from rlfleet.v1 import buffer_pb2, sample_pb2
from services.buffer.errors import BufferFull, InvalidSample, StepCommitted, UnknownGroup
from services.buffer.filters import GroupFilter
from services.buffer.gate import Gate
from services.buffer.grouping import close_group
from services.buffer.mutations import AckSteps, Add, Cancel, Deliver, Discard, Forget, Issue, Mutation, Policy, Stale
from services.buffer.observe import observe
from services.buffer.settings import BufferSettings
from services.buffer.state import Entry, Group, State
from services.buffer.stores import Store

log = logging.getLogger(__name__)


def group_id(prompt_index: int) -> str:
    return f"g{prompt_index}"


def prompt_of(gid: str) -> int | None:
    return int(gid[1:]) if gid[:1] == "g" and gid[1:].isdigit() else None


STALENESS = "staleness"   # Claim reason prefix: the replica must load newer weights first


@dataclass(frozen=True)
class ClaimResult:
    tickets: list[buffer_pb2.GroupTicket]
    finished: bool
    reason: str
    cancelled: list[str] = field(default_factory=list)    # groups of this replica the buffer no longer wants


@dataclass(frozen=True)
class PutResult:
    accepted: int
    duplicates: int
    cancelled: int = 0           # samples of cancelled groups: not stored, counted as dropped (aborted)


@dataclass(frozen=True)
class BatchResult:
    step: int
    samples: list[bytes]           # raw serialized Samples, grouped by group, ordered by index
    group_ids: list[str]
    complete: bool
    redelivered: bool


class BufferCore:
    """The buffer's state machine over a Store. Thread-safe."""

    def __init__(self, store: Store, settings: BufferSettings, filters: Sequence[GroupFilter] = (),
                 metrics: BufferMetrics | None = None, clock: Callable[[], float] = time.time) -> None:
        self.store, self.settings, self.filters = store, settings, list(filters)
        self.metrics, self.clock = metrics, clock
        self.gate = Gate.of(settings.groups_per_step, settings.over_sample, settings.publish_every,
                            settings.max_staleness)
        self._cond = threading.Condition()
        self._told: set[str] = set()     # cancelled groups some Claim reply has listed (memory only: early wake-ups)
        self.state: State = store.load()
        self._reload = False
        if metrics is not None:
            metrics.capacity.set(settings.capacity)
            observe(metrics, self.state, [])

    # ---- Claim ---------------------------------------------------------------------------------------------------
    def claim(self, replica_id: str, weight_version: int, max_groups: int, wait: float,
              restarted: bool = False, alive: Callable[[], bool] = lambda: True) -> ClaimResult:
        """restarted: the replica's first Claim since it started; tickets its id still holds are re-queued now.
        max_groups 0: issue nothing, wait only for a cancellation of this replica's groups. Every reply lists the
        replica's cancelled groups; a cancellation not yet listed ends the wait at once. alive() False (the caller
        went away) ends the wait too."""
        end = time.monotonic() + max(0.0, wait)
        with self._cond:
            if restarted:
                self._ensure_loaded()
                self.release_replica(replica_id)
            while True:
                self._ensure_loaded()
                self._forget_cancelled()
                cancelled = self._cancelled_of(replica_id)
                if self.finished:
                    return ClaimResult([], True, "finished", cancelled)
                tickets, reason = (self._issue(replica_id, weight_version, max_groups) if max_groups > 0
                                   else ([], "no tickets asked for"))
                remaining = end - time.monotonic()
                news = not self._told.issuperset(cancelled)
                # The replica's weight version cannot change during this call: waiting on staleness only adds latency.
                if (tickets or news or remaining <= 0 or reason.startswith(STALENESS) or not alive()):
                    self._told.update(cancelled)
                    return ClaimResult(tickets, False, "" if tickets else reason, cancelled)
                self._cond.wait(min(remaining, self._until_next_expiry()))

    def wake(self) -> None:
        """Wake every waiting call to re-check (e.g. a caller went away)."""
        with self._cond:
            self._cond.notify_all()

    def _cancelled_of(self, replica: str) -> list[str]:
        return [c.gid for c in self.state.cancelled.values() if c.replica == replica]

    def _forget_cancelled(self) -> None:
        now = self.clock()
        gone = tuple(gid for gid, c in self.state.cancelled.items() if c.until <= now)
        if gone:
            self._commit([Forget(gone)])
            self._told.difference_update(gone)

    def _issue(self, replica: str, version: int, max_groups: int) -> tuple[list[buffer_pb2.GroupTicket], str]:
        s, st, now = self.settings, self.state, self.clock()
        expired = sorted((g for g in st.open.values() if g.deadline <= now), key=lambda g: g.prompt_index)
        in_flight = len(st.open) - len(expired)
        stored, cursor = st.stored_samples(), st.next_prompt_index
        delivered = st.acked_groups + len(st.delivered)
        pending = len(st.ready) + len(st.open)      # live groups not yet delivered (dropped ones excluded)
        muts: list[Issue] = []
        reason = ""
        while len(muts) < max_groups:
            requeued = expired.pop(0) if expired else None
            size = requeued.group_size if requeued else s.group_size
            if stored + size * in_flight + size > s.capacity:
                reason = f"capacity: {stored} stored + {in_flight} groups in flight of {s.capacity}"
                break
            step = self.gate.step_of(delivered, pending - 1 if requeued else pending)
            if requeued is None and step >= s.steps:
                reason = "every step's groups are claimed"
                break
            need = self.gate.version_needed(step)
            if version < need:
                reason = f"{STALENESS}: step {step} needs weight version >= {need}, replica has {version}"
                if requeued is not None:
                    expired.insert(0, requeued)
                break
            if requeued is not None:
                muts.append(Issue(requeued.gid, requeued.prompt_index, size, now + s.lease_seconds, replica, version))
            else:
                muts.append(Issue(group_id(cursor), cursor, size, now + s.lease_seconds, replica, version))
                cursor += 1
                pending += 1
            in_flight += 1
        if muts:
            self._commit(list(muts))
        tickets = [buffer_pb2.GroupTicket(group_id=m.gid, prompt_index=m.prompt_index, group_size=m.group_size,
                                          lease_seconds=s.lease_seconds) for m in muts]
        return tickets, reason

    def release_replica(self, replica_id: str) -> int:
        """Re-queue every unexpired ticket `replica_id` holds (it died): the lease ends now. Returns how many.

        Samples already put for those groups are kept; the re-issued ticket carries the same group id.
        """
        with self._cond:
            now = self.clock()
            held = sorted((g for g in self.state.open.values() if g.replica == replica_id and g.deadline > now),
                          key=lambda g: g.prompt_index)
            if held:
                self._commit([Issue(g.gid, g.prompt_index, g.group_size, now, g.replica, g.version) for g in held])
                log.info("replica %s restarted: %d groups re-queued (%s)", replica_id, len(held),
                         ", ".join(g.gid for g in held[:8]))
            return len(held)

    def _until_next_expiry(self) -> float:
        now = self.clock()
        future = [g.deadline for g in self.state.open.values() if g.deadline > now]
        return max(0.01, min(future) - now) if future else 3600.0   # expired ones wait for a state change

    # ---- Put -----------------------------------------------------------------------------------------------------
    def put(self, samples: Sequence[sample_pb2.Sample], wait: float) -> PutResult:
        """Store samples durably. Malformed input refuses the whole call. Samples of a cancelled group are not stored:
        counted as dropped (aborted), once per index."""
        pairs = [(m, self._check(m)) for m in samples]
        end = time.monotonic() + max(0.0, wait)
        dropped = settled = 0               # samples of cancelled groups: counted as aborted / already counted
        with self._cond:
            while True:
                self._ensure_loaded()
                pairs, discards, repeats = self._split_cancelled(pairs)   # a group may be cancelled while we wait
                if discards:
                    self._commit(list(discards))
                dropped += sum(len(d.indices) for d in discards)
                settled += repeats
                fresh, dups = self._classify(pairs)
                if not fresh:
                    return PutResult(0, dups + settled, dropped)
                if self.state.stored_samples() < self.settings.capacity:
                    self._commit(self._put_mutations(fresh))
                    return PutResult(len(fresh), dups + settled, dropped)
                remaining = end - time.monotonic()
                if remaining <= 0:
                    raise BufferFull(f"buffer holds {self.state.stored_samples()} samples of capacity "
                                     f"{self.settings.capacity}; retry later")
                self._cond.wait(remaining)

    def _check(self, msg: sample_pb2.Sample) -> bytes:
        raw = msg.SerializeToString()
        if len(raw) > self.settings.max_sample_bytes:
            raise InvalidSample(f"sample {msg.group_id}/{msg.index} is {len(raw)} bytes, over the limit of "
                                f"{self.settings.max_sample_bytes}")
        try:
            validate_message(msg)
        except SampleError as exc:
            raise InvalidSample(f"sample {msg.group_id}/{msg.index}: {exc}") from None
        return raw

    def _split_cancelled(self, pairs: list[tuple[sample_pb2.Sample, bytes]]
                         ) -> tuple[list[tuple[sample_pb2.Sample, bytes]], list[Discard], int]:
        """(the samples of other groups, Discards for new indices of cancelled groups, repeats of counted ones)."""
        cancelled = self.state.cancelled
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

    def _classify(self, pairs: list[tuple[sample_pb2.Sample, bytes]]
                  ) -> tuple[list[tuple[sample_pb2.Sample, bytes]], int]:
        st, fresh, seen, dups = self.state, [], set(), 0
        for msg, raw in pairs:
            g = st.open.get(msg.group_id)
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
        return fresh, dups

    def _put_mutations(self, fresh: list[tuple[sample_pb2.Sample, bytes]]) -> list[Mutation]:
        seq = self.state.seq
        adds: dict[str, dict[int, Entry]] = {}
        muts: list[Mutation] = []
        for msg, raw in fresh:
            seq += 1
            muts.append(Add(msg.group_id, msg.index, seq, msg.weight_version, msg.status, msg.reward, raw))
            adds.setdefault(msg.group_id, {})[msg.index] = Entry(seq, msg.index, msg.weight_version, msg.status,
                                                                 msg.reward, raw)
        for gid, new in adds.items():
            g = self.state.open[gid]
            entries = {**g.samples, **new}
            if len(entries) == g.group_size:
                seq += 1
                muts.append(close_group(g, entries, seq, self.settings.min_valid_per_group, self.filters))
        return muts

    # ---- GetBatch ------------------------------------------------------------------------------------------------
    def get_batch(self, step: int, num_groups: int, policy_version: int, wait: float) -> BatchResult:
        n = num_groups or self.settings.groups_per_step
        end = time.monotonic() + max(0.0, wait)
        with self._cond:
            while True:
                self._ensure_loaded()
                st = self.state
                if step in st.batches:
                    return self._batch(step, st.batches[step].gids, redelivered=True)
                if step <= st.committed_step:
                    raise StepCommitted(f"step {step} is already committed (committed_step {st.committed_step})")
                muts: list[Mutation] = [] if policy_version == st.policy_version else [Policy(policy_version)]
                stale, take = self._pick(n, policy_version)
                if stale:
                    muts.append(Stale(tuple(g.gid for g in stale), tuple(g.ready_seq for g in stale),
                                      tuple(e.seq for g in stale for e in g.entries()),
                                      sum(len(g.kept) for g in stale)))
                if len(take) == n:
                    muts.append(Deliver(step, tuple(g.gid for g in take), tuple(g.ready_seq for g in take)))
                    if self.gate.over_samples:      # over_sample 1 issues no surplus: nothing to cancel
                        muts.extend(self._cancellations(step, {g.gid for g in (*take, *stale)}))
                if muts:
                    self._commit(muts)
                if len(take) == n:
                    return self._batch(step, st.batches[step].gids, redelivered=False)
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return BatchResult(step, [], [], complete=False, redelivered=False)
                self._cond.wait(remaining)

    def _pick(self, n: int, policy_version: int) -> tuple[list[Group], list[Group]]:
        floor = policy_version - self.settings.max_staleness
        stale: list = []
        take: list = []
        for g in self.state.ready.values():
            if len(take) == n:
                break
            if any(e.weight_version < floor for e in g.entries()):
                stale.append(g)
            else:
                take.append(g)
        return stale, take

    def _cancellations(self, step: int, gone: set[str]) -> list[Mutation]:
        """Once `step` has its batch, a group in flight can feed step+1 at the earliest: cancel those whose claim
        version the gate would refuse for step+1 (their samples would be stale). After the last step every group in
        flight is cancelled and every ready one left over is dropped (aborted): no step can use them."""
        nxt, until = step + 1, self.clock() + self.settings.lease_seconds
        last = nxt >= self.settings.steps
        need = self.gate.version_needed(nxt)
        doomed = [g for g in self.state.open.values() if last or g.version < need]
        if doomed:
            log.info("step %d has its batch: %d groups in flight cancelled (%s)", step, len(doomed),
                     ", ".join(g.gid for g in doomed[:8]))
        out: list[Mutation] = [Cancel(g.gid, until, tuple(sorted(g.samples)), tuple(e.seq for e in g.samples.values()))
                               for g in sorted(doomed, key=lambda g: g.prompt_index)]
        left = [g for g in self.state.ready.values() if g.gid not in gone] if last else []   # gone: taken or stale
        if left:
            seqs = tuple(e.seq for g in left for e in g.entries())
            out.append(Stale(tuple(g.gid for g in left), tuple(g.ready_seq for g in left), seqs, len(seqs), "aborted"))
        return out

    def _batch(self, step: int, gids: Sequence[str], redelivered: bool) -> BatchResult:
        groups = [self.state.delivered[gid] for gid in gids]
        return BatchResult(step, [e.data for g in groups for e in g.entries()], list(gids), True, redelivered)

    # ---- Ack -----------------------------------------------------------------------------------------------------
    def ack(self, committed_step: int) -> int:
        with self._cond:
            self._ensure_loaded()
            st = self.state
            steps = sorted(s for s in st.batches if s <= committed_step)
            if not steps and committed_step <= st.committed_step:
                return 0
            groups = [st.delivered[gid] for s in steps for gid in st.batches[s].gids]
            entries = [e for g in groups for e in g.entries()]
            self._commit([AckSteps(committed_step, tuple(steps), tuple(g.ready_seq for g in groups),
                                   tuple(e.seq for e in entries), len(entries), len(groups))])
            return len(entries)

    # ---- Stats ---------------------------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.state.committed_step >= self.settings.steps - 1

    def stats(self) -> buffer_pb2.BufferStats:
        with self._cond:
            self._ensure_loaded()
            st, now = self.state, self.clock()
            return buffer_pb2.BufferStats(
                stored_samples=st.stored_samples(), ready_groups=len(st.ready),
                partial_groups=sum(1 for g in st.open.values() if g.samples),
                tickets_in_flight=sum(1 for g in st.open.values() if g.deadline > now),
                delivered_unacked=sum(len(g.kept) for g in st.delivered.values()), acked_samples=st.acked_samples,
                dropped=st.dropped, capacity=self.settings.capacity, put_samples=st.put_samples,
                policy_version=st.policy_version, next_prompt_index=st.next_prompt_index, finished=self.finished,
                cancelled_groups=st.cancelled_groups)

    # ---- commit, reload, metrics ---------------------------------------------------------------------------------
    def _commit(self, muts: list[Mutation]) -> None:
        try:
            self.store.commit(muts, self.state)
        except Exception:
            self._reload = True       # the store may or may not hold these; trust only what it holds
            raise
        for m in muts:
            self.state.apply(m)
        if self.metrics is not None:
            observe(self.metrics, self.state, muts)
        self._cond.notify_all()

    def _ensure_loaded(self) -> None:
        if self._reload:
            self.state = self.store.load()
            self._reload = False
            log.info("buffer state reloaded from the store")
            self._cond.notify_all()

    def close(self) -> None:
        self.store.close()
