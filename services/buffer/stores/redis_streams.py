"""The Redis store: every piece of buffer state lives in Redis, so a buffer restart loses nothing.

Keys under PREFIX (rlfleet:<run>:buffer):
  samples   stream, one entry per accepted sample: id 0-<seq>, fields g (group), i (index), v (weight version),
            s (status), r (reward), d (the raw serialized Sample). Entries leave on ack or drop (XDEL).
  open      hash group_id -> JSON ticket {p, n, d, r}: groups claimed and still filling (lease deadline d).
  ready     stream, one entry per complete group: id 0-<seq>, fields g, k (kept indices), p, n. Consumer group
            `trainer`: GetBatch takes the oldest entries with XREADGROUP (they stay pending until the step is
            committed), Ack XACKs and XDELs them. Entries after the group's last-delivered id are the ready queue.
  batches   hash step -> JSON {gids, ready_seqs}: what each unacked step was given (exact re-delivery).
  meta      hash: cursor, seq, counters, committed step, policy version, dropped:<reason>.
Each commit is one MULTI/EXEC pipeline (samples are pipelined XADDs inside it), so Redis always holds a consistent
state; after any error, or when INFO shows a new redis run_id (a restart the client reconnected through), the
buffer reloads everything from Redis. On load, pending `ready` entries that no batch
records (a consumer that died between read and record), idle for orphan_idle_ms, are taken over with XAUTOCLAIM
and queued again.
Durability is Redis's: run it with --appendonly yes (appendfsync everysec survives a kill -9 of redis-server).
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

from services.buffer.mutations import AckSteps, Add, Close, Counters, Deliver, Issue, Mutation, Policy, Stale
from services.buffer.state import State
from services.buffer.stores import StoreError

GROUP = b"trainer"
CONSUMER = b"buffer"
log = logging.getLogger(__name__)


def sid(seq: int) -> str:
    return f"0-{seq}"


def seq_of(stream_id: bytes | str) -> int:
    text = stream_id.decode() if isinstance(stream_id, bytes) else stream_id
    return int(text.partition("-")[2])


class RedisStore:
    """Buffer state in Redis Streams and hashes; see the module docstring for the key layout."""

    def __init__(self, url: str, prefix: str = "rlfleet:run:buffer", client: redis.Redis | None = None,
                 orphan_idle_ms: int = 0) -> None:
        # no client-side retries: a re-sent MULTI could apply twice; the buffer reloads instead
        self.r = client or redis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), socket_timeout=30,
                                                socket_connect_timeout=5)
        self.k = {name: f"{prefix}:{name}" for name in ("samples", "open", "ready", "batches", "meta")}
        self._run_id = ""
        self.orphan_idle_ms = orphan_idle_ms    # 0: the buffer is the only reader, so at start any is orphaned

    # ---- load ----------------------------------------------------------------------------------------------------
    def load(self) -> State:
        try:
            return self._load()
        except redis.RedisError as exc:
            raise StoreError(f"redis: {exc}") from exc

    def _load(self) -> State:
        self._run_id = self.r.info("server")["run_id"]
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
            muts.append(Issue(gid, t["p"], t["n"], t["d"], t["r"]))
            muts.extend(by_group.pop(gid, []))
        if by_group:
            log.warning("redis store: samples of unknown groups ignored: %s", sorted(by_group)[:5])
        muts.extend(closes)
        muts.extend(Deliver(step, tuple(b["gids"]), tuple(b["ready_seqs"])) for step, b in sorted(batches.items()))
        dropped = {k.partition(":")[2]: int(v) for k, v in meta.items() if k.startswith("dropped:")}
        muts.append(Counters(int(meta.get("cursor", 0)), int(meta.get("seq", 0)), int(meta.get("put", 0)),
                             int(meta.get("acked", 0)), int(meta.get("acked_groups", 0)),
                             int(meta.get("committed_step", -1)), int(meta.get("policy", 0)), dropped))
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

    # ---- commit --------------------------------------------------------------------------------------------------
    def commit(self, mutations: list[Mutation], state: State) -> None:
        pipe = self.r.pipeline(transaction=True)
        checks: list[tuple[int, tuple[int, ...]]] = []
        cursor, seq = state.next_prompt_index, state.seq
        for m in mutations:
            if isinstance(m, Issue):
                cursor = max(cursor, m.prompt_index + 1)
                ticket = {"p": m.prompt_index, "n": m.group_size, "d": m.deadline, "r": m.replica}
                pipe.hset(self.k["open"], m.gid, json.dumps(ticket))
                pipe.hset(self.k["meta"], "cursor", cursor)
            elif isinstance(m, Add):
                seq = max(seq, m.seq)
                pipe.xadd(self.k["samples"], {"g": m.gid, "i": m.index, "v": m.weight_version, "s": m.status,
                                              "r": repr(m.reward), "d": m.data}, id=sid(m.seq))
                pipe.hincrby(self.k["meta"], "put", 1)
            elif isinstance(m, Close):
                seq = max(seq, m.seq)
                g = state.open[m.gid]
                pipe.hdel(self.k["open"], m.gid)
                if m.kept:
                    pipe.xadd(self.k["ready"], {"g": m.gid, "k": ",".join(map(str, m.kept)), "p": g.prompt_index,
                                                "n": g.group_size}, id=sid(m.seq))
                self._drop(pipe, m.drop_seqs, m.drops)
            elif isinstance(m, Stale):
                if m.ready_seqs:
                    pipe.xdel(self.k["ready"], *map(sid, m.ready_seqs))
                self._drop(pipe, m.sample_seqs, {"stale": m.samples})
            elif isinstance(m, Deliver):
                checks.append((len(pipe), m.ready_seqs))
                pipe.xreadgroup(GROUP, CONSUMER, {self.k["ready"]: ">"}, count=len(m.ready_seqs))
                pipe.hset(self.k["batches"], m.step, json.dumps({"gids": m.gids, "ready_seqs": m.ready_seqs}))
            elif isinstance(m, AckSteps):
                if m.ready_seqs:
                    ids = list(map(sid, m.ready_seqs))
                    pipe.xack(self.k["ready"], GROUP, *ids)
                    pipe.xdel(self.k["ready"], *ids)
                if m.sample_seqs:
                    pipe.xdel(self.k["samples"], *map(sid, m.sample_seqs))
                if m.steps:
                    pipe.hdel(self.k["batches"], *m.steps)
                pipe.hincrby(self.k["meta"], "acked", m.samples)
                pipe.hincrby(self.k["meta"], "acked_groups", m.groups)
                pipe.hset(self.k["meta"], "committed_step", max(state.committed_step, m.committed_step))
            elif isinstance(m, Policy):
                pipe.hset(self.k["meta"], "policy", m.version)
            else:
                raise TypeError(f"redis store cannot commit {m!r}")
        pipe.hset(self.k["meta"], "seq", seq)
        pipe.info("server")
        try:
            results = pipe.execute()
        except redis.RedisError as exc:
            raise StoreError(f"redis: {exc}") from exc
        if results[-1]["run_id"] != self._run_id:    # restarted since load: it may hold less than we remember
            raise StoreError("redis restarted since the state was loaded")
        for pos, expected in checks:
            got = tuple(seq_of(e[0]) for _, entries in (results[pos] or []) for e in entries)
            if got != expected:
                raise StoreError(f"redis: ready stream delivered {got}, expected {expected}")

    def _drop(self, pipe: Any, seqs: tuple[int, ...], drops: dict[str, int]) -> None:
        if seqs:
            pipe.xdel(self.k["samples"], *map(sid, seqs))
        for reason, n in drops.items():
            if n:
                pipe.hincrby(self.k["meta"], f"dropped:{reason}", n)

    def close(self) -> None:
        self.r.close()
