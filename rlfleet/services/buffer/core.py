"""The buffer's decisions: tickets, puts, group completion, batches, acks. Transport-free; one lock.

Every call computes mutations from the current State, commits them to the store (durable), then applies them.
Waiting calls sleep on one condition variable, woken by every change and by the next lease expiry. The mutations are
computed by pure functions of the State beside it: tickets.py (which tickets a Claim gets), put_sorting.py (what a
Put's samples do), resume.py (what a trainer's checkpoint means for the samples held).

Group ids are `g<prompt_index>`, issued from the durable cursor, and an expired ticket is re-issued with the same
id (samples already put for it are kept). So the committed-id set needs no storage of its own: a sample whose group
was issued (index < cursor) but is no longer open (ready, delivered, acked or dropped) is a late or duplicate put and
is ignored; a group never issued is refused.

Over-sampling (settings.over_sample > 1, rlfleet.services.buffer.gate): up to ceil(over_sample * groups_per_step)
groups are
issued per step. When a step's batch is delivered, every group still in flight whose claim version is too old for the
next step (or that no step is left for) is cancelled: its ticket ends, its samples drop as `aborted`, and the group is
remembered for lease_seconds so Claim tells its replica (which aborts the engine requests) and its late puts are
dropped as `aborted` too, never stored.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from rlfleet.run_dir.lineage import Epoch
from rlfleet.runtime.metrics import BufferMetrics
from rlfleet.sample import SequenceTooLong
from rlfleet.sample.batch_check import first_invalid
from rlfleet.sample.limits import SampleLimits
from rlfleet.services.buffer.errors import BufferFull, InvalidRequest, InvalidSample, StepCommitted
from rlfleet.services.buffer.filters import GroupFilter
from rlfleet.services.buffer.gate import Gate
from rlfleet.services.buffer.lineage_check import LineageCheck
from rlfleet.services.buffer.mutations import (
    AckSteps,
    Cancel,
    Deliver,
    Forget,
    Issue,
    Mutation,
    Policy,
    Quarantine,
    Refuse,
    Stale,
)
from rlfleet.services.buffer.observe import observe
from rlfleet.services.buffer.put_sorting import classify, put_mutations, split_cancelled
from rlfleet.services.buffer.results import (
    MAX_REASON,
    BatchResult,
    ClaimResult,
    PutResult,
    RejectResult,
    ResumeResult,
    outcomes,
)
from rlfleet.services.buffer.resume import check_not_behind, resumed_trained, trained_mutations
from rlfleet.services.buffer.settings import BufferSettings
from rlfleet.services.buffer.state import Group, State
from rlfleet.services.buffer.stores import Store, StoreError, Superseded
from rlfleet.services.buffer.tickets import STALENESS, issue_mutations
from rlfleet.v1 import buffer_pb2, sample_pb2

log = logging.getLogger(__name__)


F = TypeVar("F", bound=Callable[..., Any])


def durable_reply(fn: F) -> F:
    """A reply waits, after the lock is released, until every commit written so far is durable (store.sync): its
    own, and any it read. Group commit: concurrent replies share one fsync."""

    @functools.wraps(fn)
    def wrapper(self: BufferCore, *args: Any, **kwargs: Any) -> Any:
        out = fn(self, *args, **kwargs)
        self._settle()
        return out

    return wrapper  # type: ignore[return-value]


class BufferCore:
    """The buffer's state machine over a Store. Thread-safe."""

    def __init__(self, store: Store, settings: BufferSettings, filters: Sequence[GroupFilter] = (),
                 metrics: BufferMetrics | None = None, clock: Callable[[], float] = time.time,
                 limits: SampleLimits | None = None, version_lead: int | None = None) -> None:
        self.store, self.settings, self.filters = store, settings, list(filters)
        self.limits, self.version_lead = limits or SampleLimits(), version_lead   # lead None: versions unbounded
        self.metrics, self.clock = metrics, clock
        self.gate = Gate.of(settings.groups_per_step, settings.over_sample, settings.publish_every,
                            settings.max_staleness)
        self.share = settings.fair_share(self.gate.per_step)    # tickets one replica may hold (None: no cap)
        self.refused: dict[tuple[str, str], int] = {}           # (replica, reason) -> Put calls refused
        self._cond = threading.Condition()
        self._lineage = LineageCheck(keep=4 * settings.capacity + 1024)
        self._told: set[str] = set()     # cancelled groups some Claim reply has listed (memory only: early wake-ups)
        self.state: State = store.load()
        self._reload = False
        self._written = 0                 # the token of the last commit appended (store.sync waits for it)
        self.superseded = threading.Event()   # a newer buffer took over the store: this one must exit
        if metrics is not None:
            metrics.capacity.set(settings.capacity)
            observe(metrics, self.state, [])

    # ---- Claim ---------------------------------------------------------------------------------------------------
    def claim(self, replica_id: str, weight_version: int, max_groups: int, wait: float,
              restarted: bool = False, alive: Callable[[], bool] = lambda: True) -> ClaimResult:
        """restarted: the replica's first Claim since it started; tickets its id still holds are re-queued now.
        max_groups 0: issue nothing, wait only for a cancellation of this replica's groups. Every reply lists the
        replica's cancelled groups; a cancellation not yet listed ends the wait at once. alive() False (the caller
        went away) ends the wait too.

        The reply does not wait for the fsync of its tickets: a Put's reply does (every commit written before it),
        so no acknowledged sample depends on a ticket a power loss could take; a ticket lost that way is issued
        again, and the holder's Puts for it are refused (never issued) or dropped (superseded_lease)."""
        end = time.monotonic() + max(0.0, wait)
        newest = self._newest_version()
        if newest is not None and weight_version > newest:
            raise InvalidRequest(f"weight_version {weight_version} is more than {self.version_lead} ahead of the "
                                 f"last policy version reported ({self.state.policy_version})")
        with self._cond:
            if restarted:
                self._ensure_loaded()
                self._release_replica(replica_id)
            while True:
                self._ensure_loaded()
                self._forget_cancelled()
                cancelled = self._cancelled_of(replica_id)
                if self.finished:
                    return ClaimResult([], True, "finished", cancelled)
                allowed = self._allowed_tickets(replica_id, max_groups)
                tickets, reason = (self._issue(replica_id, weight_version, allowed) if allowed > 0
                                   else ([], "no tickets asked for" if max_groups <= 0 else
                                         f"fair share: {replica_id} holds {self.share} tickets already"))
                remaining = end - time.monotonic()
                news = not self._told.issuperset(cancelled)
                # The replica's weight version cannot change during this call: waiting on staleness only adds latency.
                if (tickets or news or remaining <= 0 or reason.startswith(STALENESS) or not alive()):
                    self._told.update(cancelled)
                    return ClaimResult(tickets, False, "" if tickets else reason, cancelled)
                self._cond.wait(min(remaining, self._until_next_expiry()))

    def _allowed_tickets(self, replica: str, max_groups: int) -> int:
        """max_groups, cut to what the replica may still take of its fair share (BufferSettings.fair_share)."""
        if self.share is None:
            return max_groups
        now = self.clock()
        held = sum(1 for g in self.state.open.values() if g.replica == replica and g.deadline > now)
        return max(0, min(max_groups, self.share - held))

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
        """tickets.issue_mutations on the current state, committed. Called with the lock held."""
        s = self.settings
        muts, reason = issue_mutations(self.state, s, self.gate, replica, version, max_groups, self.clock())
        if muts:
            self._commit(list(muts))
        tickets = [buffer_pb2.GroupTicket(group_id=m.gid, prompt_index=m.prompt_index, group_size=m.group_size,
                                          lease_seconds=s.lease_seconds) for m in muts]
        return tickets, reason

    @durable_reply
    def release_replica(self, replica_id: str) -> int:
        """Re-queue every unexpired ticket `replica_id` holds (it died): the lease ends now. Returns how many.

        Samples already put for those groups are kept; the re-issued ticket carries the same group id.
        """
        return self._release_replica(replica_id)

    def _release_replica(self, replica_id: str) -> int:
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
    @durable_reply
    def put(self, samples: Sequence[sample_pb2.Sample], wait: float) -> PutResult:
        """Store samples durably. Malformed input refuses the whole call. Samples of a cancelled group are not stored:
        counted as dropped (aborted), once per index."""
        pairs = self._checked(samples)
        end = time.monotonic() + max(0.0, wait)
        dropped = settled = 0               # samples of cancelled groups: counted as aborted / already counted
        cancelled_ids: set[int] = set()     # id() of the messages of cancelled groups
        with self._cond:
            while True:
                self._ensure_loaded()
                before = pairs
                pairs, discards, repeats = split_cancelled(self.state, pairs)   # a group may be cancelled while we wait
                if len(pairs) < len(before):       # the first put of each discarded index; repeats are duplicates
                    kept = {id(m) for m, _ in pairs}
                    new = {(d.gid, i) for d in discards for i in d.indices}
                    for m, _ in before:
                        if id(m) not in kept and (m.group_id, m.index) in new:
                            new.discard((m.group_id, m.index))
                            cancelled_ids.add(id(m))
                if discards:
                    self._commit(list(discards))
                dropped += sum(len(d.indices) for d in discards)
                settled += repeats
                fresh, dups, late = classify(self.state, pairs)
                if late:          # put under a lease since re-issued to another replica: never displaces its samples
                    self._commit([Refuse("superseded_lease", len(late))])
                    log.info("%d samples put under superseded leases dropped (%s)", len(late),
                             ", ".join(sorted({f"{m.group_id} from {m.replica_id}" for m, _ in late})[:4]))
                    settled += len(late)
                    gone = {id(m) for m, _ in late}
                    pairs = [p for p in pairs if id(p[0]) not in gone]
                if not fresh:
                    return PutResult(0, dups + settled, dropped, outcomes(samples, set(), cancelled_ids))
                if self.state.stored_samples() < self.settings.capacity:
                    self._commit(put_mutations(self.state, fresh, self.settings.min_valid_per_group,
                                               self.filters))
                    return PutResult(len(fresh), dups + settled, dropped,
                                     outcomes(samples, {id(m) for m, _ in fresh}, cancelled_ids))
                remaining = end - time.monotonic()
                if remaining <= 0:
                    raise BufferFull(f"buffer holds {self.state.stored_samples()} samples of capacity "
                                     f"{self.settings.capacity}; retry later")
                self._cond.wait(remaining)

    def _checked(self, samples: Sequence[sample_pb2.Sample]) -> list[tuple[sample_pb2.Sample, bytes]]:
        """(message, its bytes) of each sample; InvalidSample naming the first one over the size limit or invalid
        (validate_message's checks, run over all the samples at once: rlfleet.sample.batch_check)."""
        pairs = [(m, m.SerializeToString()) for m in samples]
        for msg, raw in pairs:
            if len(raw) > self.settings.max_sample_bytes:
                self._refused(msg, "too_large")
                raise InvalidSample(f"sample {msg.group_id}/{msg.index} is {len(raw)} bytes, over the limit of "
                                    f"{self.settings.max_sample_bytes}")
        bad = first_invalid(samples, self._limits())
        if bad is not None:
            msg = samples[bad[0]]
            self._refused(msg, "max_seq_len" if isinstance(bad[1], SequenceTooLong) else "invalid")
            raise InvalidSample(f"sample {msg.group_id}/{msg.index}: {bad[1]}")
        return pairs

    def _refused(self, msg: sample_pb2.Sample, reason: str) -> None:
        """Count a Put refused for this sample, per replica (rlfleet_buffer_put_refused_samples) and in memory."""
        replica = msg.replica_id or "unknown"
        with self._cond:
            self.refused[(replica, reason)] = self.refused.get((replica, reason), 0) + 1
        if self.metrics is not None:
            self.metrics.put_refused.labels(replica=replica, reason=reason).inc()

    def _newest_version(self) -> int | None:
        """The newest weight version a caller may name: the trainer's policy version plus the allowed lead."""
        return None if self.version_lead is None else self.state.policy_version + self.version_lead

    def _limits(self) -> SampleLimits:
        return replace(self.limits, max_weight_version=self._newest_version())

    # ---- GetBatch ------------------------------------------------------------------------------------------------
    @durable_reply
    def get_batch(self, step: int, num_groups: int, policy_version: int, wait: float,
                  lineage: Sequence[Epoch] = (), ack_through: int | None = None) -> BatchResult:
        """lineage: the trainer's (rlfleet/run_dir/lineage.py); groups with a sample outside it are dropped
        (abandoned_lineage), like those newer than policy_version. ack_through: first acknowledge every batch up to
        that step exactly as ack() does (it must be < step), in the same commit as the delivery (or on its own when
        the call delivers nothing new); durable before the reply, like the delivery."""
        n = num_groups or self.settings.groups_per_step
        end = time.monotonic() + max(0.0, wait)
        if ack_through is not None and ack_through >= step:
            raise InvalidRequest(f"ack_through_step {ack_through} must be before the step asked for ({step})")
        acked = 0
        with self._cond:
            first = True
            while True:
                self._ensure_loaded()
                st = self.state
                ack = self._ack_steps(ack_through) if first and ack_through is not None else None
                first = False
                acked += ack.samples if ack is not None else 0
                acks: list[Mutation] = [ack] if ack is not None else []
                if step in st.batches:
                    if acks:
                        self._commit(acks)
                    return self._batch(step, st.batches[step].gids, redelivered=True, acked=acked)
                if step <= st.committed_step:
                    raise StepCommitted(f"step {step} is already committed (committed_step {st.committed_step})")
                newest = self._newest_version()
                if newest is not None and policy_version > newest:
                    raise InvalidRequest(f"policy_version {policy_version} is more than {self.version_lead} ahead "
                                         f"of the last one reported ({st.policy_version})")
                muts: list[Mutation] = [*acks, *([] if policy_version == st.policy_version
                                                 else [Policy(policy_version)])]
                stale, abandoned, take = self._pick(n, policy_version, lineage)
                for gone, reason in ((stale, "stale"), (abandoned, "abandoned_lineage")):
                    if gone:
                        muts.append(Stale(tuple(g.gid for g in gone), tuple(g.ready_seq for g in gone),
                                          tuple(e.seq for g in gone for e in g.entries()),
                                          sum(len(g.kept) for g in gone), reason))
                stale = [*stale, *abandoned]
                if len(take) == n:
                    muts.append(Deliver(step, tuple(g.gid for g in take), tuple(g.ready_seq for g in take)))
                    if self.gate.over_samples:      # over_sample 1 issues no surplus: nothing to cancel
                        muts.extend(self._cancellations(step, {g.gid for g in (*take, *stale)}))
                if muts:
                    self._commit(muts)
                if len(take) == n:
                    return self._batch(step, st.batches[step].gids, redelivered=False, acked=acked)
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return BatchResult(step, [], [], complete=False, redelivered=False, acked=acked)
                self._cond.wait(remaining)

    def _pick(self, n: int, policy_version: int, lineage: Sequence[Epoch] = ()
              ) -> tuple[list[Group], list[Group], list[Group]]:
        """(stale groups, groups of an abandoned lineage, the n to deliver), oldest first. A sample newer than the
        trainer's policy cannot come from its lineage (replicas only hold versions it published): it was generated
        by weights of a trainer that died after publishing them and resumed from an older checkpoint; once the new
        trainer re-publishes those version numbers, the samples' epochs tell the two apart (lineage)."""
        floor = policy_version - self.settings.max_staleness
        stale: list = []
        abandoned: list = []
        take: list = []
        for g in self.state.ready.values():
            if len(take) == n:
                break
            if any(e.weight_version > policy_version for e in g.entries()) or not self._lineage.belongs(g, lineage):
                abandoned.append(g)
            elif any(e.weight_version < floor for e in g.entries()):
                stale.append(g)
            else:
                take.append(g)
        return stale, abandoned, take

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

    def _batch(self, step: int, gids: Sequence[str], redelivered: bool, acked: int = 0) -> BatchResult:
        groups = [self.state.delivered[gid] for gid in gids]
        return BatchResult(step, [e.data for g in groups for e in g.entries()], list(gids), True, redelivered,
                           acked)

    # ---- Ack -----------------------------------------------------------------------------------------------------
    def ack(self, committed_step: int) -> int:
        """Acknowledge every batch up to committed_step. The reply does not wait for the fsync (the next durable
        reply's fsync covers it): a lost Ack loses nothing and trains nothing twice, since acks are cumulative, a
        batch that is still unacked is only ever re-delivered for its own step, and the trainer acks its checkpoint
        again when it resumes."""
        with self._cond:
            self._ensure_loaded()
            mut = self._ack_steps(committed_step)
            if mut is None:
                return 0
            self._commit([mut])
            return mut.samples

    def _ack_steps(self, committed_step: int, past_delivered: bool = False) -> AckSteps | None:
        """The mutation acknowledging every batch up to committed_step (None: nothing left to acknowledge).
        InvalidRequest past the last delivered step, unless past_delivered (a resumed trainer's checkpoint, whose
        deliveries a buffer that lost records no longer holds). Called with the lock held."""
        st = self.state
        delivered = max(st.batches, default=st.committed_step)
        if committed_step > max(delivered, st.committed_step) and not past_delivered:
            raise InvalidRequest(f"committed_step {committed_step} is past the last delivered step {delivered}")
        steps = sorted(s for s in st.batches if s <= committed_step)
        if not steps and committed_step <= st.committed_step:
            return None
        groups = [st.delivered[gid] for s in steps for gid in st.batches[s].gids]
        entries = [e for g in groups for e in g.entries()]
        return AckSteps(committed_step, tuple(steps), tuple(g.ready_seq for g in groups),
                        tuple(e.seq for e in entries), len(entries), len(groups))

    # ---- Reject ---------------------------------------------------------------------------------------------------
    @durable_reply
    def reject(self, step: int, group_ids: Sequence[str], reason: str) -> RejectResult:
        """Quarantine groups of the delivered batch for `step` the trainer cannot use (all of it when group_ids is
        empty): they leave the store for good, recorded with `reason`, and are never delivered again. The batch's
        other groups are ready again (newest), so re-asking for the step delivers a fresh batch. Durable before the
        reply: a buffer restarted after it never hands those groups out again. Naming groups already quarantined
        changes nothing (a retried call); a caller that may retry names its groups."""
        reason = reason.strip()
        if not reason:
            raise InvalidRequest("a Reject names its reason")
        if len(reason.encode()) > MAX_REASON:
            raise InvalidRequest(f"reason is {len(reason.encode())} bytes, over the limit of {MAX_REASON}")
        with self._cond:
            self._ensure_loaded()
            st = self.state
            if group_ids and all(g in st.quarantined for g in group_ids):
                return RejectResult(0, 0, 0)            # a retried Reject: already done
            batch = st.batches.get(step)
            if batch is None:
                raise InvalidRequest(f"step {step} has no delivered, unacknowledged batch (committed_step "
                                     f"{st.committed_step})")
            named = list(dict.fromkeys(group_ids)) or list(batch.gids)
            foreign = [g for g in named if g not in batch.gids]
            if foreign:
                raise InvalidRequest(f"groups {', '.join(foreign[:4])} are not in the batch for step {step}")
            bad = set(named)
            gone = [st.delivered[g] for g in batch.gids if g in bad]
            kept = [g for g in batch.gids if g not in bad]
            seqs = tuple(e.seq for g in gone for e in g.entries())
            requeue_seqs = tuple(range(st.seq + 1, st.seq + 1 + len(kept)))
            self._commit([Quarantine(step, tuple(g.gid for g in gone), reason, tuple(g.ready_seq for g in gone),
                                     seqs, len(seqs), tuple(kept), requeue_seqs)])
            log.warning("step %d: the trainer rejected %d groups (%s): %s; %d groups ready again", step, len(gone),
                        ", ".join(g.gid for g in gone[:8]), reason, len(kept))
            return RejectResult(len(gone), len(seqs), len(kept))

    # ---- samples a checkpoint already committed -------------------------------------------------------------------
    @durable_reply
    def trainer_resume(self, checkpoint_step: int, trained: Mapping[str, int], allow_older: bool) -> ResumeResult:
        """A trainer starts from the checkpoint at checkpoint_step (-1: none), before its first GetBatch; trained:
        sample id -> the step of the checkpoint that committed it. CheckpointBehind (nothing changed) when the
        checkpoint is older than the committed step, unless allow_older: the samples acknowledged for the steps
        after it left the buffer. Else, in one commit: drop (reason `trained`) every ready or open group holding a
        sample a checkpoint after the committed step and through checkpoint_step committed (the trainer sealed it
        and stopped before this buffer recorded its Ack, or this buffer lost records), and acknowledge every step
        through checkpoint_step. A retried call changes nothing more."""
        with self._cond:
            self._ensure_loaded()
            committed = self.state.committed_step
            check_not_behind(checkpoint_step, committed, allow_older)
            drops, dropped = self._trained_mutations(resumed_trained(trained, committed, checkpoint_step))
            ack = self._ack_steps(checkpoint_step, past_delivered=True) if checkpoint_step > committed else None
            muts: list[Mutation] = [*drops, *([ack] if ack is not None else [])]
            if muts:
                self._commit(muts)
            return ResumeResult(committed, dropped, ack.samples if ack is not None else 0)

    @durable_reply
    def drop_trained(self, committed: Mapping[str, int]) -> int:
        """Drop (reason `trained`) every ready or open group holding a sample a trainer checkpoint committed
        (sample id `gid/index` -> checkpoint step): a store that lost recent records (power loss under a weaker
        fsync, a salvaged log) would otherwise deliver it again. Returns the samples dropped."""
        if not committed:
            return 0
        with self._cond:
            self._ensure_loaded()
            muts, n = self._trained_mutations(committed)
            if muts:
                self._commit(muts)
            return n

    def _trained_mutations(self, committed: Mapping[str, int]) -> tuple[list[Mutation], int]:
        """resume.trained_mutations on the current state, cancelled groups remembered for a lease. Lock held."""
        return trained_mutations(self.state, committed, self.clock() + self.settings.lease_seconds)

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
                cancelled_groups=st.cancelled_groups, quarantined_groups=len(st.quarantined),
                quarantine_reasons=st.quarantine_reasons(), committed_step=st.committed_step)

    # ---- commit, reload, metrics ---------------------------------------------------------------------------------
    def _commit(self, muts: list[Mutation]) -> None:
        """Write muts (the reply syncs them: durable_reply) and apply them. Called with the lock held."""
        try:
            self._written = self.store.append(muts, self.state)
        except Exception as exc:
            self._reload = True       # the store may or may not hold these; trust only what it holds
            self._note_superseded(exc)
            raise
        for m in muts:
            self.state.apply(m)
        if self.metrics is not None:
            observe(self.metrics, self.state, muts)
        self._cond.notify_all()

    def _settle(self) -> None:
        """Wait (without the lock) until the last commit written is durable; on failure reload before the next call."""
        try:
            self.store.sync(self._written)
        except StoreError as exc:
            with self._cond:
                self._reload = True
            self._note_superseded(exc)
            raise

    def _note_superseded(self, exc: BaseException) -> None:
        if isinstance(exc, Superseded) and not self.superseded.is_set():
            log.error("buffer superseded: %s", exc)
            self.superseded.set()

    def healthy(self) -> bool:
        """False while the store keeps failing; a failing store is probed with a harmless write to see it recover."""
        with self._cond:
            if self.superseded.is_set():
                return False
            if self.store.healthy():
                return True
            try:
                ok = self.store.probe()
            except StoreError as exc:
                self._note_superseded(exc)
                return False
            if ok:
                self._reload = True        # trust only what the store holds
            return ok

    def _ensure_loaded(self) -> None:
        if self._reload:
            self.state = self.store.load()
            self._reload = False
            log.info("buffer state reloaded from the store")
            self._cond.notify_all()

    def close(self) -> None:
        self.store.close()
