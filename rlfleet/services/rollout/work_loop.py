"""The replica's work loop: Claim groups from the buffer, run the rollout function per group in a worker thread,
Put each group's samples together once the rollout function has yielded them all (a group is trainable only whole;
one Put is one durable commit) or every PUT_BATCH_BYTES, retrying until the buffer has them, stop when the run is
finished. A rollout function that declares a group collector (`group_collector.py`: the built-in `single_turn`, whose
collector is `single_turn_groups.py`) runs on that one thread instead, unless `perf.single_turn_collector` is off:
same samples, no thread per group.

Every Claim reply lists the replica's groups the buffer cancelled (over-sampled work no step can use): their engine
requests are aborted at once, freeing batch slots and KV memory. With every slot busy the loop still long-polls Claim
(max_groups 0) so a cancellation reaches it promptly; that poll is dropped the moment a slot frees."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from rlfleet.protocols import DataSource, GroupTicket, RolloutContext, RolloutFn, iter_samples
from rlfleet.sample import Sample, Status
from rlfleet.sample.put_wire import RawPut, encode_put_request, raw_put
from rlfleet.services.rollout.context import GroupContext
from rlfleet.services.rollout.engines.base import Engine, admission_held
from rlfleet.services.rollout.group_collector import CollectedRolloutFn, GroupCollector, StartedGroup
from rlfleet.v1 import buffer_pb2, buffer_pb2_grpc

log = logging.getLogger(__name__)

RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED)
ACCEPTED, DUPLICATE, CANCELLED, REFUSED, STOPPED = "accepted", "duplicate", "cancelled", "refused", "stopped"


@dataclass(frozen=True)
class WorkSettings:
    replica_id: str
    run_id: str
    claim_groups: int
    claim_wait: float = 2.0          # seconds Claim may block
    put_wait: float = 5.0            # seconds Put may block on back-pressure
    deadline_slack: float = 10.0     # added to each wait for the RPC deadline


OUTCOME = {buffer_pb2.PUT_ACCEPTED: ACCEPTED, buffer_pb2.PUT_DUPLICATE: DUPLICATE, buffer_pb2.PUT_CANCELLED: CANCELLED}
PUT_BATCH_BYTES = 4 << 20        # a group's samples are put together, in requests of at most this many bytes


@dataclass
class _Waiting:
    """One caller's samples waiting for a Put (SamplePutter.deliver_many)."""

    samples: Sequence[Sample]
    encoded: Sequence[bytes]
    size: int
    outcomes: list[str] | None = None       # set under SamplePutter._lock, as are error and lead
    error: BaseException | None = None
    lead: bool = False              # this caller sends the next Put
    ready: threading.Event = field(default_factory=threading.Event)    # set after outcomes, error or lead


class SamplePutter:
    """Put samples; on UNAVAILABLE / RESOURCE_EXHAUSTED / DEADLINE_EXCEEDED keep them and retry with backoff.
    put: Buffer.Put taking an encoded PutRequest (rlfleet.sample.put_wire.raw_put): each sample is serialized once and
    framed, never copied into a PutRequest message (which costs ~8x more to serialize for a large sample).

    Groups that finish together share a Put: callers of deliver_many queue their samples, and while one caller's
    Put is in flight the others wait; the next leader sends everything queued by then (up to PUT_BATCH_BYTES) in
    one request, and each caller gets its own samples' outcomes. One Put is one durable commit in the buffer, so a
    step's 32 groups cost a few commits and RPCs instead of 32 (the buffer's CPU is shared with the trainer and
    the engine)."""

    def __init__(self, put: RawPut, settings: WorkSettings, stop: threading.Event) -> None:
        self._put, self._s, self._stop = put, settings, stop
        self._lock = threading.Lock()
        self._queue: list[_Waiting] = []
        self._sending = False           # a leader holds the Put

    def put(self, sample: Sample) -> bool:
        return self.deliver(sample) in (ACCEPTED, DUPLICATE, CANCELLED)

    def deliver(self, sample: Sample) -> str:
        """ACCEPTED; DUPLICATE (the buffer no longer waits for this group: complete, dropped or re-issued and done
        elsewhere); CANCELLED (the buffer cancelled the group: dropped, counted as aborted); REFUSED; or STOPPED (stop
        was set while retrying)."""
        return self.deliver_many([sample])[0]

    def deliver_many(self, samples: Sequence[Sample], encoded: Sequence[bytes] | None = None) -> list[str]:
        """deliver() of each sample, in one Put (one durable commit, one fsync), which samples other callers
        deliver at the same time may share. A request the buffer refuses as a whole (one malformed sample refuses
        the call) is split into one Put per sample, so only the bad one is lost. encoded: the samples' serialized
        bytes, when the caller has them."""
        if not samples:
            return []
        if encoded is None:
            encoded = [s.to_proto().SerializeToString() for s in samples]
        mine = _Waiting(samples, encoded, sum(map(len, encoded)))
        with self._lock:
            self._queue.append(mine)
            mine.lead, self._sending = not self._sending, True
        while True:
            with self._lock:
                if mine.outcomes is not None:
                    return mine.outcomes
                if mine.error is not None:
                    raise mine.error
                lead, mine.lead = mine.lead, False
                if not lead:
                    mine.ready.clear()
            if lead:
                self._send_queued()
            else:
                mine.ready.wait()

    def _send_queued(self) -> None:
        """As the leader: one Put of the queue's head (up to PUT_BATCH_BYTES, at least one caller), each caller's
        outcomes to it, and the lead to the caller now first in the queue, if any."""
        with self._lock:
            batch: list[_Waiting] = []
            size = 0
            while self._queue and (not batch or size + self._queue[0].size <= PUT_BATCH_BYTES):
                size += self._queue[0].size
                batch.append(self._queue.pop(0))
        outcomes: list[str] = []
        error: BaseException | None = None
        try:
            outcomes = self._put_now([s for w in batch for s in w.samples], [e for w in batch for e in w.encoded])
        except BaseException as exc:  # noqa: BLE001 - each caller in the batch raises it
            error = exc
        with self._lock:
            at = 0
            for w in batch:
                if error is None:
                    w.outcomes, at = outcomes[at:at + len(w.samples)], at + len(w.samples)
                else:
                    w.error = error
            nxt = self._queue[0] if self._queue else None
            if nxt is None:
                self._sending = False
            else:
                nxt.lead = True
        for w in batch:
            w.ready.set()
        if nxt is not None:
            nxt.ready.set()

    def _put_now(self, samples: Sequence[Sample], encoded: Sequence[bytes]) -> list[str]:
        request = encode_put_request(encoded, self._s.put_wait)
        backoff = 0.2
        while True:
            try:
                reply = self._put(request, timeout=self._s.put_wait + self._s.deadline_slack)
                return _outcomes(reply, len(samples))
            except grpc.RpcError as exc:
                if exc.code() not in RETRYABLE:
                    if len(samples) > 1:          # one Put per sample: only the bad one is lost
                        return [self._put_now([s], [e])[0] for s, e in zip(samples, encoded, strict=True)]
                    log.error("Put of sample %s refused (%s: %s); dropped", samples[0].sample_id, exc.code(),
                              exc.details())
                    return [REFUSED]
                if self._stop.is_set():
                    log.warning("stopping with %d samples not put (%s), e.g. %s", len(samples), exc.code(),
                                samples[0].sample_id)
                    return [STOPPED] * len(samples)
                log.info("Put of %d samples (%s...): %s; retrying in %.1fs", len(samples), samples[0].sample_id,
                         exc.code(), backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)


def _outcomes(reply: buffer_pb2.PutReply, n: int) -> list[str]:
    """Each sample's outcome: from the reply's per-sample list, or (a buffer that sends none) from its counts."""
    if len(reply.outcomes) == n:
        return [OUTCOME.get(o, DUPLICATE) for o in reply.outcomes]
    if reply.accepted == n or not (reply.cancelled or reply.duplicates):
        return [ACCEPTED] * n
    return [CANCELLED if reply.cancelled else DUPLICATE] * n


class _PutBatches:
    """Samples held for a Put with their serialized bytes; put (`emit`) whenever they reach PUT_BATCH_BYTES, and by
    flush(). Each sample is serialized once, as it is added."""

    def __init__(self, emit: Callable[[Sequence[Sample], Sequence[bytes]], list[str]]) -> None:
        self._emit = emit
        self._held: list[Sample] = []
        self._raw: list[bytes] = []
        self._bytes = 0

    def add(self, sample: Sample) -> None:
        encoded = sample.to_proto().SerializeToString()
        self._held.append(sample)
        self._raw.append(encoded)
        self._bytes += len(encoded)
        if self._bytes >= PUT_BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Put what is held (nothing when empty); it is let go once the Put returned."""
        self._emit(self._held, self._raw)
        self._held, self._raw, self._bytes = [], [], 0


class WorkLoop:
    def __init__(self, channel: grpc.Channel, engine: Engine, ctx: RolloutContext, data: DataSource,
                 rollout_fn: RolloutFn, settings: WorkSettings, stop: threading.Event,
                 on_sample: Callable[[Sample], None] = lambda s: None,
                 epoch_of: Callable[[int], int] = lambda version: 0, collector: bool = True) -> None:
        """collector: run a rollout function that declares a group collector (CollectedRolloutFn: the built-in
        single_turn, whose collector is SingleTurnGroups) on that collector rather than a thread per group; other
        rollout functions always get a thread per group."""
        self._stub = buffer_pb2_grpc.BufferStub(channel)
        self._epoch_of = epoch_of          # trainer epoch of an applied version (WeightUpdater.epoch_of)
        self._engine, self._ctx, self._data, self._fn = engine, ctx, data, rollout_fn
        self._s = settings
        self._stop = stop
        self._putter = SamplePutter(raw_put(channel), settings, stop)
        self._on_sample = on_sample
        self._pool = ThreadPoolExecutor(max_workers=settings.claim_groups, thread_name_prefix="group")
        self._in_flight: set[Future[None]] = set()
        self._groups: dict[str, GroupContext] = {}      # group id -> its context (to abort its engine requests)
        self._lock = threading.Lock()
        self._slot_free = threading.Event()
        self._restarted = True          # the first Claim re-queues what an earlier process of this replica held
        self._draining = threading.Event()
        self._new_weights = threading.Event()   # set when the engine loads a version (a staleness gate may open)
        self._collector: GroupCollector | None = rollout_fn.collector(ctx, data, self._finish_groups) \
            if collector and isinstance(rollout_fn, CollectedRolloutFn) else None

    @property
    def in_flight_groups(self) -> int:
        return len(self._in_flight)

    def run(self) -> bool:
        """Serve until Claim says the run is finished (True), or stop is set or a drain begins (False)."""
        backoff = 0.5
        while not (self._stop.is_set() or self._draining.is_set()):
            free = max(0, self._s.claim_groups - self.in_flight_groups)
            self._new_weights.clear()            # before the Claim: a version loaded after it ends the wait below
            try:
                reply = self._claim(free) if free else self._poll()
                backoff = 0.5
            except grpc.RpcError as exc:
                log.info("Buffer.Claim: %s; retrying in %.1fs", exc.code(), backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            if reply is None:                        # a slot freed during the poll
                continue
            self.abort_cancelled(reply.cancelled)
            if reply.finished:
                aborted = self.abort_groups()
                log.info("buffer says the run is finished%s",
                         f"; {aborted} engine requests of unneeded groups aborted" if aborted else "")
                return True
            if free and not reply.tickets:
                log.debug("no tickets: %s", reply.reason)
                # the buffer already waited (or answered at once for staleness, which only new weights change):
                # claim again when the engine loads a version, or after 50 ms
                self._new_weights.wait(0.05)
            with admission_held(self._engine):       # a Claim's groups start in the engine together
                for t in reply.tickets:
                    self._start(GroupTicket(group_id=t.group_id, prompt_index=t.prompt_index,
                                            group_size=t.group_size))
        return False

    def weights_changed(self) -> None:
        """The engine now serves a new version: a Claim refused for staleness may succeed now."""
        self._new_weights.set()

    def begin_drain(self) -> None:
        """Claim no more work (run() returns); the groups in flight go on until drain() decides."""
        self._draining.set()
        self._slot_free.set()           # end a poll in progress at once

    def drain(self, seconds: float) -> int:
        """Let the groups in flight finish for up to `seconds`, then hand the rest back to the buffer: one Claim
        that asks for nothing with `restarted` set re-queues every group this replica id holds, at once (their
        late Puts are refused as superseded). Returns the number of groups handed back."""
        deadline = time.monotonic() + seconds
        while self.in_flight_groups and time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(0.05)
        left = self.in_flight_groups
        if left:
            self._restarted = True
            try:
                self._claim(0)
            except grpc.RpcError as exc:
                log.warning("drain: could not hand %d groups back (%s); the buffer re-queues them when their "
                            "lease expires", left, exc.code())
            self.abort_groups()
        log.info("drained: %d groups handed back to the buffer", left)
        return left

    def _claim(self, max_groups: int) -> buffer_pb2.ClaimReply:
        reply = self._stub.Claim(self._request(max_groups), timeout=self._s.claim_wait + self._s.deadline_slack)
        self._restarted = False
        return reply

    def _poll(self) -> buffer_pb2.ClaimReply | None:
        """Every slot is busy: wait in Claim (asking for no tickets) for a cancellation of this replica's groups, or
        until a slot frees (then None: the poll is cancelled and the loop claims work at once). The buffer ends a poll
        early only for cancellations no reply has listed yet, so a reply that arrived is never thrown away."""
        self._slot_free.clear()
        if self.in_flight_groups < self._s.claim_groups:
            return None
        wait = self._s.claim_wait
        answered = threading.Event()                 # this call's own: a cancelled earlier poll cannot set it
        call = self._stub.Claim.future(self._request(0), timeout=wait + self._s.deadline_slack)
        call.add_done_callback(lambda _: answered.set())
        end = time.monotonic() + wait + self._s.deadline_slack + 1.0
        while not (answered.wait(0.05) or self._slot_free.is_set() or self._stop.is_set()
                   or time.monotonic() > end):
            pass
        if call.done() and not call.cancelled():
            return call.result()
        call.cancel()
        return None

    def _request(self, max_groups: int) -> buffer_pb2.ClaimRequest:
        return buffer_pb2.ClaimRequest(replica_id=self._s.replica_id, weight_version=self._engine.weight_version,
                                       max_groups=max_groups, wait_seconds=self._s.claim_wait,
                                       restarted=self._restarted)

    def abort_cancelled(self, group_ids: Sequence[str]) -> int:
        """Abort the engine requests of the groups the buffer cancelled (those this replica still runs)."""
        with self._lock:
            groups = [(gid, self._groups[gid]) for gid in group_ids if gid in self._groups]
        fresh = [(gid, g) for gid, g in groups if not g.aborted]
        aborted = sum(g.abort() for _, g in fresh)
        if fresh:
            log.info("buffer cancelled %d groups in flight (%s): %d engine requests aborted", len(fresh),
                     ", ".join(gid for gid, _ in fresh[:8]), aborted)
        return aborted

    def abort_groups(self) -> int:
        """Abort the engine requests of every group in flight (over-sampled work the run no longer needs)."""
        with self._lock:
            groups = list(self._groups.values())
        return sum(g.abort() for g in groups)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._collector is not None:
            self._collector.close()

    def _start(self, ticket: GroupTicket) -> None:
        if self._collector is not None:
            done: Future[None] = Future()
            gctx = GroupContext(self._ctx, self._engine, ticket.group_id)
            with self._lock:
                self._in_flight.add(done)
                self._groups[ticket.group_id] = gctx
            done.add_done_callback(self._done)
            self._collector.start(ticket, gctx, done)
            return
        future = self._pool.submit(self._run_group, ticket)
        with self._lock:
            self._in_flight.add(future)
        future.add_done_callback(self._done)

    def _finish_groups(self, groups: Sequence[StartedGroup]) -> None:
        """The collector's completed groups: their samples in shared Puts (of at most PUT_BATCH_BYTES), FAILED
        placeholders for a group that could not start, then their claim slots freed."""
        try:
            batches = _PutBatches(self._emit)
            for sample in (s for g in groups for s in g.samples):
                batches.add(self._stamped(sample))
            batches.flush()
            for g in groups:
                if g.error is None:
                    continue
                if g.aborted:
                    log.info("group %s aborted", g.ticket.group_id)
                else:
                    log.warning("group %s (prompt %d): %s", g.ticket.group_id, g.ticket.prompt_index, g.error)
                    self._fail_rest(g.ticket, set(), g.error)
        except Exception:  # noqa: BLE001 - the slots must free whatever happened; the groups' leases re-queue them
            log.exception("putting %d groups failed", len(groups))
        finally:
            with self._lock:
                for g in groups:
                    self._groups.pop(g.ticket.group_id, None)
            for g in groups:
                g.done.set_result(None)

    def _done(self, future: Future[None]) -> None:
        with self._lock:
            self._in_flight.discard(future)
        self._slot_free.set()

    def _run_group(self, ticket: GroupTicket) -> None:
        started = time.monotonic()
        delivered: set[int] = set()
        gctx = GroupContext(self._ctx, self._engine, ticket.group_id)
        with self._lock:
            self._groups[ticket.group_id] = gctx
        batches = _PutBatches(self._emit)   # yielded, not yet put: a group is put together (it is ready only whole)
        try:
            prompt = self._data[ticket.prompt_index]
            for sample in iter_samples(self._fn(gctx, prompt, ticket)):
                delivered.add(sample.index)
                batches.add(self._stamped(sample))
            # DUPLICATE is not "group done": a re-issued group answers it for the indices its dead holder put.
            batches.flush()
        except Exception as exc:  # noqa: BLE001 - a failing rollout function fails its group, not the replica
            batches.flush()              # what it yielded before it raised
            if gctx.aborted:
                log.info("group %s aborted (%s)", ticket.group_id, type(exc).__name__)
            else:
                log.warning("group %s (prompt %d): rollout raised %s: %s", ticket.group_id, ticket.prompt_index,
                            type(exc).__name__, exc)
                self._fail_rest(ticket, delivered, f"rollout_fn raised {type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._groups.pop(ticket.group_id, None)
        log.debug("group %s: %d samples in %.2fs", ticket.group_id, len(delivered), time.monotonic() - started)

    def _stamped(self, sample: Sample) -> Sample:
        sample.run_id = sample.run_id or self._s.run_id
        sample.replica_id = sample.replica_id or self._s.replica_id
        sample.weight_epoch = sample.weight_epoch or self._epoch_of(sample.weight_version)
        return sample

    def _emit(self, samples: Sequence[Sample], encoded: Sequence[bytes] | None = None) -> list[str]:
        samples = [self._stamped(s) for s in samples]
        outcomes = self._putter.deliver_many(samples, encoded)
        for sample, outcome in zip(samples, outcomes, strict=True):
            if outcome == ACCEPTED:
                self._on_sample(sample)
        return outcomes

    def _fail_rest(self, ticket: GroupTicket, delivered: set[int], reason: str) -> None:
        """Put FAILED placeholders for the indices the rollout function did not deliver, so the group completes."""
        self._emit([Sample(group_id=ticket.group_id, index=i, group_size=ticket.group_size, prompt_ids=[],
                           response_ids=[], rollout_logprobs=[], status=Status.FAILED, status_reason=reason,
                           prompt_index=ticket.prompt_index, weight_version=self._engine.weight_version)
                    for i in range(ticket.group_size) if i not in delivered])
