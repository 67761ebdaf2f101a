"""The Redis store: every piece of buffer state lives in Redis, so a buffer restart loses nothing.

Keys under PREFIX (rlfleet:<run>:buffer):
  samples   stream, one entry per accepted sample: id 0-<seq>, fields g (group), i (index), v (weight version),
            s (status), r (reward), d (the raw serialized Sample). Entries leave on ack or drop (XDEL).
  open      hash group_id -> JSON ticket {p, n, d, r}: groups claimed and still filling (lease deadline d).
  ready     stream, one entry per complete group: id 0-<seq>, fields g, k (kept indices), p, n. Consumer group
            `trainer`: GetBatch takes the oldest entries with XREADGROUP (they stay pending until the step is
            committed), Ack XACKs and XDELs them. Entries after the group's last-delivered id are the ready queue.
  batches   hash step -> JSON {gids, ready_seqs}: what each unacked step was given (exact re-delivery).
  cancelled hash group_id -> JSON {p, n, r, u, i}: groups cancelled in flight, kept until u (their replica is told
            and their late puts dropped); i: indices already counted as dropped (aborted).
  quarantine hash group_id -> JSON {s, r}: groups the trainer rejected (step, reason); their samples and ready
            entries are gone, the record stays (they are never delivered again).
  meta      hash: cursor, seq, counters, committed step, policy version, dropped:<reason>, cancelled_groups.
  epoch     integer: the writer epoch. The first load() INCRs it and keeps the value; every commit WATCHes it and
            checks it before MULTI, so a buffer that a newer one superseded (a zombie across a partition) has its
            transaction refused whole (Superseded: it exits), never partly applied.
Each commit is one MULTI/EXEC pipeline (samples are pipelined XADDs inside it; see redis_commit), so Redis always
holds a consistent state; after any error, or when INFO shows a new redis run_id (a restart the client reconnected
through; asked after any new connection), the buffer reloads everything from Redis. On load, pending `ready` entries
that no batch records (a consumer that died between read and record), idle for orphan_idle_ms, are taken over with
XAUTOCLAIM and queued again.
Durability is Redis's: run it with --appendonly yes --appendfsync always (Redis replies to EXEC only after the AOF
fsync, so an acknowledged call survives power loss); `everysec` survives a kill -9 of redis-server but a power loss
loses up to ~1 s of acknowledged Puts, deliveries and Acks. The first load() checks the server's setting against
buffer.redis_durability (redis_durability.py) and refuses to start on a weaker one unless that field names it.
The buffer process must be the only writer of its prefix.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from rlfleet.services.buffer.mutations import Add, Cancel, Close, Counters, Deliver, Issue, Mutation, Quarantine
from rlfleet.services.buffer.state import State
from rlfleet.services.buffer.stores import StoreError, Superseded
from rlfleet.services.buffer.stores.redis_commit import CONSUMER, GROUP, CommitBuilder, sid
from rlfleet.services.buffer.stores.redis_durability import Durability, check_durability

log = logging.getLogger(__name__)


def seq_of(stream_id: bytes | str) -> int:
    text = stream_id.decode() if isinstance(stream_id, bytes) else stream_id
    return int(text.partition("-")[2])


class RedisStore:
    """Buffer state in Redis Streams and hashes; see the module docstring for the key layout."""

    def __init__(self, url: str, prefix: str = "rlfleet:run:buffer", client: redis.Redis | None = None,
                 orphan_idle_ms: int = 0, info_every_commit: bool = False, durability: Durability = "always") -> None:
        # no client-side retries: a re-sent MULTI could apply twice; the buffer reloads instead
        self._connects = self._checked = 0
        # info_every_commit: for a proxy that keeps client connections across a restart of the server behind it
        self._watching = client is None and not info_every_commit
        self.r = client or redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), socket_timeout=30,
                                                socket_connect_timeout=5, redis_connect_func=self._on_connect)
        self.k = {name: f"{prefix}:{name}" for name in ("samples", "open", "ready", "batches", "cancelled", "meta",
                                                          "epoch", "quarantine")}
        self._run_id = ""
        self.epoch = 0                          # this writer's epoch, taken by the first load()
        self.failure: str | None = None
        self.orphan_idle_ms = orphan_idle_ms    # 0: the buffer is the only reader, so at start any is orphaned
        self.durability = durability            # buffer.redis_durability: what the server's persistence must be

    # ---- load ----------------------------------------------------------------------------------------------------
    def load(self) -> State:
        try:
            return self._load()
        except redis.RedisError as exc:
            raise StoreError(f"redis: {exc}") from exc

    def _load(self) -> State:
        self._checked = self._connects
        self._run_id = self.r.info("server")["run_id"]
        if self.epoch == 0:
            check_durability(self.r, self.durability)       # WeakDurability: refused before taking an epoch
            self.epoch = int(self.r.incr(self.k["epoch"]))
        else:
            self._check_epoch(self.r.get(self.k["epoch"]))
        try:
            self.r.xgroup_create(self.k["ready"], GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        batches = {int(step): json.loads(raw) for step, raw in self.r.hgetall(self.k["batches"]).items()}
        self._requeue_orphans({s for b in batches.values() for s in b["ready_seqs"]})
        meta = {k.decode(): v.decode() for k, v in self.r.hgetall(self.k["meta"]).items()}
        by_group: dict[str, list[Add]] = defaultdict(list)
        for entry_id, f in self._scan(self.k["samples"]):
            gid = f[b"g"].decode()
            by_group[gid].append(Add(gid, int(f[b"i"]), seq_of(entry_id), int(f[b"v"]), int(f[b"s"]),
                                     float(f[b"r"]), f[b"d"]))
        muts: list[Mutation] = []
        closes: list[Mutation] = []
        for entry_id, f in self._scan(self.k["ready"]):
            gid = f[b"g"].decode()
            muts.append(Issue(gid, int(f[b"p"]), int(f[b"n"]), 0.0, ""))
            muts.extend(by_group.pop(gid, []))
            kept = tuple(int(i) for i in f[b"k"].decode().split(","))
            closes.append(Close(gid, kept, seq_of(entry_id), {}, ()))
        for gid_b, raw in self.r.hgetall(self.k["open"]).items():
            gid, t = gid_b.decode(), json.loads(raw)
            muts.append(Issue(gid, t["p"], t["n"], t["d"], t["r"], t.get("v", 0)))
            muts.extend(by_group.pop(gid, []))
        if by_group:
            log.warning("redis store: samples of unknown groups ignored: %s", sorted(by_group)[:5])
        muts.extend(closes)
        records: dict[tuple[int, str], list[str]] = {}        # before the batches (State._quarantine)
        for gid_b, raw in self.r.hgetall(self.k["quarantine"]).items():
            q = json.loads(raw)
            records.setdefault((int(q["s"]), q["r"]), []).append(gid_b.decode())
        muts.extend(Quarantine(step, tuple(gids), reason) for (step, reason), gids in records.items())
        muts.extend(Deliver(step, tuple(b["gids"]), tuple(b["ready_seqs"])) for step, b in sorted(batches.items()))
        for gid_b, raw in self.r.hgetall(self.k["cancelled"]).items():
            gid, c = gid_b.decode(), json.loads(raw)
            muts += [Issue(gid, c["p"], c["n"], c["u"], c["r"]), Cancel(gid, c["u"], tuple(c["i"]), ())]
        dropped = {k.partition(":")[2]: int(v) for k, v in meta.items() if k.startswith("dropped:")}
        muts.append(Counters(int(meta.get("cursor", 0)), int(meta.get("seq", 0)), int(meta.get("put", 0)),
                             int(meta.get("acked", 0)), int(meta.get("acked_groups", 0)),
                             int(meta.get("committed_step", -1)), int(meta.get("policy", 0)), dropped,
                             int(meta.get("cancelled_groups", 0))))
        state = State()
        for m in muts:
            state.apply(m)
        return state

    def _scan(self, key: str, chunk: int = 512) -> Iterator[tuple[bytes, dict[bytes, bytes]]]:
        start = "-"
        while True:
            entries = self.r.xrange(key, min=start, max="+", count=chunk)
            yield from entries
            if len(entries) < chunk:
                return
            start = "(" + entries[-1][0].decode()

    def _requeue_orphans(self, in_batches: set[int]) -> None:
        """Pending ready entries no batch records belong to a dead read: claim them and queue them again."""
        start: Any = "0-0"
        orphans: list[tuple[bytes, dict[bytes, bytes]]] = []
        while True:
            start, entries, *_ = self.r.xautoclaim(self.k["ready"], GROUP, CONSUMER,
                                                   min_idle_time=self.orphan_idle_ms, start_id=start, count=256)
            orphans.extend(e for e in entries if e[1] and seq_of(e[0]) not in in_batches)
            if start in (b"0-0", "0-0"):
                break
        if not orphans:
            return
        seq = int(self.r.hget(self.k["meta"], "seq") or 0)
        pipe = self.r.pipeline(transaction=True)
        for entry_id, fields in orphans:
            seq += 1
            pipe.xack(self.k["ready"], GROUP, entry_id)
            pipe.xdel(self.k["ready"], entry_id)
            pipe.xadd(self.k["ready"], fields, id=sid(seq))
        pipe.hset(self.k["meta"], "seq", seq)
        pipe.execute()
        log.warning("redis store: re-queued %d ready groups read by a dead consumer", len(orphans))

    def _check_epoch(self, current: bytes | str | None) -> None:
        now = int(current or 0)
        if now != self.epoch:
            self.failure = f"redis: writer epoch is {now}, this buffer holds {self.epoch}: superseded"
            raise Superseded(self.failure)

    # ---- commit --------------------------------------------------------------------------------------------------
    def append(self, mutations: list[Mutation], state: State) -> int:
        """Commit (Redis answers EXEC once the AOF has it, fsynced with appendfsync always); the token is unused."""
        self.commit(mutations, state)
        return 0

    def sync(self, token: int) -> None:
        """Nothing to wait for: commit returned after Redis applied (and, with appendfsync always, fsynced) it."""

    def healthy(self) -> bool:
        return self.failure is None

    def probe(self) -> bool:
        try:
            self.r.ping()
            self._check_epoch(self.r.get(self.k["epoch"]))
        except redis.RedisError:
            return False
        self.failure = None
        return True

    def commit(self, mutations: list[Mutation], state: State) -> None:
        try:
            results, builder = self._fenced_commit(mutations, state)
            self._check_same_server(results[-1] if not self._watching else None)
        except Superseded:
            raise
        except redis.WatchError as exc:
            # redis-py raises WatchError for a connection lost while watching too: superseded only if the epoch moved
            try:
                self._check_epoch(self.r.get(self.k["epoch"]))
            except redis.RedisError as again:
                self.failure = f"redis: {again}"
                raise StoreError(self.failure) from exc
            self.failure = f"redis: transaction aborted ({exc}); the epoch is still ours"
            raise StoreError(self.failure) from exc
        except redis.RedisError as exc:
            self.failure = f"redis: {exc}"
            raise StoreError(self.failure) from exc
        except StoreError as exc:
            self.failure = str(exc)
            raise
        self.failure = None
        for pos, expected in builder.checks:
            got = tuple(seq_of(e[0]) for _, entries in (results[pos] or []) for e in entries)
            if got != expected:
                raise StoreError(f"redis: ready stream delivered {got}, expected {expected}")

    def _fenced_commit(self, mutations: list[Mutation], state: State) -> tuple[list[Any], CommitBuilder]:
        """WATCH the epoch, check it is ours, then MULTI/EXEC the commit: a newer writer's INCR between the check and
        EXEC aborts the whole transaction (WatchError), so a superseded buffer applies nothing."""
        with self.r.pipeline(transaction=True) as pipe:
            pipe.watch(self.k["epoch"])
            self._check_epoch(pipe.get(self.k["epoch"]))
            pipe.multi()
            builder = CommitBuilder(pipe, self.k, state)
            builder.queue(mutations)
            if not self._watching:
                pipe.info("server")
            return pipe.execute(), builder

    def _on_connect(self, conn: redis.Connection) -> None:
        conn.on_connect()
        self._connects += 1

    def _check_same_server(self, info: dict[str, Any] | None) -> None:
        """StoreError when the server is not the run that load() read: a restart may have lost recent writes.

        A restart breaks every connection, so only a commit that used a new connection (counted by _on_connect)
        needs the run_id: then INFO is asked once, not in every commit. A client passed in is not watched, nor is
        any with info_every_commit: those commits carry INFO in their MULTI.
        """
        if info is not None and info["run_id"] != self._run_id:
            raise StoreError("redis restarted since the state was loaded")
        while self._watching and self._connects != self._checked:
            self._checked = self._connects
            if self.r.info("server")["run_id"] != self._run_id:
                raise StoreError("redis restarted since the state was loaded")

    def close(self) -> None:
        self.r.close()
