"""Fault harness: a real buffer service (subprocess, gRPC; embedded log or a real redis-server) under a seeded
schedule of faults, driven by replica and trainer workers that record a ledger (tests.faults.ledger).

Workers (threads of this process, each an "incarnation" that a fault can kill mid-work and a new one replaces):
  replicas  Claim (restarted=True on an incarnation's first Claim), then one Put per sample, retried through
            UNAVAILABLE; every acknowledged sample id goes in the ledger.
  trainer   for each step: GetBatch until complete, write the committed step record (a checkpoint folder
            RUN_DIR/checkpoints/step_N with committed_ids_rank00000.json, as the trainer does), then Ack. A new
            incarnation resumes after the last record (acks it again first). `trained` is read from those records.
Faults (seeded kinds, times, durations):
  buffer_kill9   SIGKILL the buffer, restart it
  buffer_stop    SIGSTOP the buffer for 0.5-2 s, SIGCONT
  power_loss     (embedded) SIGSTOP, SIGKILL, then cut the log as a power loss may: back to the end of the last
                 commit anything acknowledged depends on (a Put's samples, a delivered batch; Claim replies do not
                 wait for their fsync)
                 or to a random byte offset after it, half the time zero-filling the rest; restart
  disk_full      (embedded) writes past the log's last commit fail (RLIMIT_FSIZE of the live process) for 1-2.5 s
  redis_kill9    (redis) SIGKILL redis-server, restart it on its AOF (appendfsync always)
  redis_stop     (redis) SIGSTOP redis-server for 0.5-2 s
  redis_power_loss  (redis) SIGSTOP, SIGKILL redis-server, cut its AOF back to what a power loss with appendfsync
                 always may keep (tests/faults/redis_power_loss.py: the last complete command, the end of the last
                 transaction anything acknowledged depends on, or a random offset after it); restart it on it
  replica_kill   a replica incarnation dies mid-group; a new one starts (restarted=True)
  trainer_kill   the trainer incarnation dies after a GetBatch or after writing a record; a new one resumes
Each fault is timed from its injection to serving again (the first reply the store's work backs, to a call made
after it) and to the next step committed after it ended; a fault that damaged the store's files (a torn log frame or
AOF command) must be reported in the buffer's or redis-server's log, else it is counted silent.
Run: python -m tests.faults.harness --seeds 100 [--store embedded|redis|both] [--steps 16] [--faults 4]
    [--kinds redis_power_loss,...] [--table]   (--table: the markdown table of tests/faults/report.py)

Run mode (tests/faults/run_mode.py): the real `rlfleet run` launcher and its service processes instead of worker
threads, SIGKILL and SIGSTOP/SIGCONT of a rollout replica, trainer-0, the buffer, weight_sync and redis-server,
power loss of the whole run and disk full for the buffer or trainer-0 (embedded store), a run the fault ended
resumed with --resume; the ledger from durable evidence only (tests/faults/evidence.py):
python -m tests.faults.harness --mode run --seeds 100 [--store embedded|redis|both] [--steps 24] [--faults 3]
    [--kinds power_loss,buffer_disk_full,...]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc
import yaml

from rlfleet.runtime.rpc import wait_healthy
from rlfleet.services.buffer.stores import Store
from rlfleet.services.buffer.stores.embedded import LOG_NAME, decode_commit
from rlfleet.services.buffer.stores.logfile import HEADER_BYTES, scan, scan_bytes
from rlfleet.v1 import buffer_pb2, buffer_pb2_grpc, sample_pb2
from tests.faults.disk_full import fill_disk_for, log_end
from tests.faults.ledger import Fault, Ledger, Verdict, check, next_step
from tests.faults.redis_power_loss import power_loss as redis_power_loss
from tests.integration.test_buffer_contract import make_sample
from tests.integration.test_buffer_service import TOKEN, BufferProcess
from tests.support.redis_server import RedisServer, free_port

T = TypeVar("T")
RETRY = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED}
EMBEDDED_FAULTS = ("buffer_kill9", "buffer_stop", "power_loss", "disk_full", "replica_kill", "trainer_kill")
REDIS_FAULTS = ("buffer_kill9", "buffer_stop", "redis_kill9", "redis_stop", "redis_power_loss", "replica_kill",
                "trainer_kill")
PREFIX = "rlfleet:faults:buffer"          # the buffer's Redis keys (run.name faults)
GROUP_SIZE, GROUPS_PER_STEP, REPLICAS = 2, 2, 2


class Stop(Exception):
    """The worker's incarnation was killed, or the run is over."""


class Cluster:
    """The buffer process (and redis-server) of one run, with fault injection."""

    def __init__(self, work: Path, store: str, steps: int) -> None:
        self.store, self.run_dir = store, work / "run"
        self.redis = RedisServer(work / "redis").start() if store == "redis" else None
        port = free_port()
        self.run_dir.mkdir(parents=True)
        (self.run_dir / "token").write_text(TOKEN)
        buffer: dict[str, object] = {"capacity": 64, "max_staleness": 1000, "min_valid_per_group": 1,
                                     "lease_seconds": 60.0}
        if self.redis is not None:
            buffer.update(store="redis", redis_url=self.redis.url)
        cfg = {"run": {"name": "faults", "dir": str(self.run_dir)}, "model": {"path": "x"},
               "rollout": {"data_source": "a:b", "reward_fn": "a:b", "group_size": GROUP_SIZE},
               "buffer": buffer, "trainer": {"steps": steps, "groups_per_step": GROUPS_PER_STEP},
               "security": {"mode": "token", "token_file": str(self.run_dir / "token")},
               "endpoints": {"buffer": f"127.0.0.1:{port}"}}
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
        self.buffer = BufferProcess(self.run_dir / "config.yaml", port).start()
        self.lock = threading.Lock()          # faults on the buffer process one at a time

    def start_buffer(self) -> None:
        """Start the buffer and wait until it serves; a loaded machine may take more than BufferProcess's 30 s."""
        try:
            self.buffer.start()
        except TimeoutError:
            wait_healthy(self.buffer.address, timeout=120)

    @property
    def pid(self) -> int:
        assert self.buffer.proc is not None
        return self.buffer.proc.pid

    def kill9(self, pause: float, fault: Fault) -> None:
        self.buffer.kill9()
        time.sleep(pause)
        fault.ended = time.monotonic()        # recovery time includes the restart
        self.start_buffer()

    def freeze(self, pid: int, seconds: float) -> None:
        os.kill(pid, signal.SIGSTOP)
        time.sleep(seconds)
        os.kill(pid, signal.SIGCONT)

    def power_loss(self, ledger: Ledger, rng: random.Random, fault: Fault) -> str:
        os.kill(self.pid, signal.SIGSTOP)
        time.sleep(0.3)                       # replies already on the wire reach the workers' ledger
        with ledger.lock:
            keep = durable_floor(self.run_dir / "buffer" / LOG_NAME, ledger)
        self.buffer.kill9()
        path = self.run_dir / "buffer" / LOG_NAME
        data = path.read_bytes()
        scanned = scan_bytes(path, data)      # the last frame's end; the file goes on with zeros written ahead
        end = scanned.end
        cut = keep if rng.random() < 0.5 else rng.randint(keep, end)
        tail = b"\0" * (len(data) - cut) if rng.random() < 0.5 else b""
        path.write_bytes(data[:cut] + tail)
        if cut < end and cut not in {0, *(o + HEADER_BYTES + len(b) for o, b in scanned.frames)}:
            fault.damage = "torn frame"
        seen = self.buffer.log.stat().st_size if self.buffer.log.exists() else 0
        fault.ended = time.monotonic()
        self.start_buffer()
        with self.buffer.log.open("rb") as f:       # the restarted buffer has read the log before it serves
            f.seek(seen)
            fault.reported = b"cut off" in f.read()
        return f"cut {len(data) - cut} of {len(data)} bytes{' (zero-filled)' if tail else ''}" + (
            f" ({fault.damage})" if fault.damage else "")

    def disk_full(self, seconds: float) -> None:
        fill_disk_for(self.pid, log_end(self.run_dir / "buffer" / LOG_NAME), seconds)

    def stats(self) -> buffer_pb2.BufferStats:
        return retry(lambda: self.buffer.stub().Stats(buffer_pb2.StatsRequest(), timeout=5), threading.Event())

    def stored_ids(self) -> set[str]:
        """Sample ids still in the store (open or ready groups) once the buffer is stopped."""
        if self.redis is not None:
            from rlfleet.services.buffer.stores.redis_streams import RedisStore

            store: Store = RedisStore(self.redis.url, prefix=PREFIX)
            state = store.load()
        else:
            from rlfleet.services.buffer.stores.embedded import EmbeddedStore

            store = EmbeddedStore(self.run_dir / "buffer")
            state = store.load()
        store.close()
        return ({f"{g.gid}/{i}" for g in state.open.values() for i in g.samples}
                | {f"{g.gid}/{i}" for g in state.ready.values() for i in g.kept})

    def stop_buffer(self) -> None:
        if self.buffer.proc is not None and self.buffer.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.buffer.terminate()

    def close(self) -> None:
        self.stop_buffer()
        if self.redis is not None:
            self.redis.stop()


def durable_floor(path: Path, ledger: Ledger) -> int:
    """The end of the last commit that something acknowledged depends on: a power loss keeps at least that (every
    such reply followed its fsync) and may lose anything after it."""
    result = scan(path)
    for offset, body in reversed(result.frames):
        for m in decode_commit(body):
            name = type(m).__name__
            if ((name == "Add" and f"{m.gid}/{m.index}" in ledger.put)  # type: ignore[union-attr]
                    or (name == "Deliver" and m.step in ledger.delivered)):  # type: ignore[union-attr]
                return offset + HEADER_BYTES + len(body)
    return 0


def retry(fn: Callable[[], T], dead: threading.Event, patience: float = 120.0) -> T:
    return retry_timed(fn, dead, patience)[0]


def retry_timed(fn: Callable[[], T], dead: threading.Event, patience: float = 120.0) -> tuple[T, float]:
    """fn's reply, retried through RETRY codes, and when the attempt that got it was made."""
    end = time.monotonic() + patience
    while True:
        if dead.is_set():
            raise Stop
        try:
            started = time.monotonic()
            return fn(), started
        except grpc.RpcError as exc:
            if exc.code() not in RETRY or time.monotonic() > end:
                raise
            time.sleep(0.05)


class Worker:
    """A worker role run by successive incarnations; kill() ends the current one and starts the next."""

    def __init__(self, name: str, body: Callable[[threading.Event, int], None], errors: list[str]) -> None:
        self.name, self.body, self.errors = name, body, errors
        self.incarnation = 0
        self.finished = threading.Event()
        self._start()

    def _start(self) -> None:
        self.dead = threading.Event()
        dead, n = self.dead, self.incarnation

        def run() -> None:
            try:
                self.body(dead, n)
                if not dead.is_set():
                    self.finished.set()
            except Stop:
                pass
            except Exception as exc:   # a worker error is a finding: reported, the run fails
                self.errors.append(f"{self.name}#{n}: {type(exc).__name__}: {exc}")
                self.finished.set()

        self.thread = threading.Thread(target=run, name=f"{self.name}#{n}", daemon=True)
        self.thread.start()

    def kill(self) -> None:
        if self.finished.is_set():
            return
        self.dead.set()
        self.thread.join(60)
        self.incarnation += 1
        if not self.finished.is_set():
            self._start()


def write_record(run_dir: Path, step: int, ids: list[str]) -> None:
    """The trainer's committed step record: a complete checkpoint folder (renamed into place whole)."""
    final = run_dir / "checkpoints" / f"step_{step:08d}"
    tmp = final.with_name(f".tmp-{final.name}")
    tmp.mkdir(parents=True, exist_ok=True)
    name = "committed_ids_rank00000.json"
    (tmp / name).write_text(json.dumps(ids))
    (tmp / "meta.json").write_text(json.dumps({"step": step, "version": step + 1, "world_size": 1}))
    (tmp / "checksums.json").write_text(json.dumps({name: {"bytes": (tmp / name).stat().st_size}}))
    if final.exists():                    # the same step again: a record is written once
        raise AssertionError(f"step {step} committed twice")
    os.rename(tmp, final)


def read_records(run_dir: Path) -> dict[int, list[str]]:
    out = {}
    for path in sorted((run_dir / "checkpoints").glob("step_*")):
        out[int(path.name[5:])] = json.loads((path / "committed_ids_rank00000.json").read_text())
    return out


def run_seed(seed: int, store: str, work: Path, steps: int = 16, faults: int = 4, step_seconds: float = 0.25,
             kinds: tuple[str, ...] | None = None) -> tuple[Verdict, list[str]]:
    """One seeded run; returns the verdict and a log of what was injected. kinds: the fault kinds drawn from (the
    store's all by default)."""
    rng = random.Random(seed)
    kinds = kinds or (EMBEDDED_FAULTS if store == "embedded" else REDIS_FAULTS)
    cluster = Cluster(work, store, steps)
    ledger = Ledger()
    injected: list[tuple[Fault, str]] = []
    errors: list[str] = []
    over = threading.Event()

    def stub() -> buffer_pb2_grpc.BufferStub:
        return cluster.buffer.stub()

    def replica(k: int) -> Callable[[threading.Event, int], None]:
        def body(dead: threading.Event, n: int) -> None:
            first = True
            while True:
                def claim(f: bool = first) -> buffer_pb2.ClaimReply:
                    return stub().Claim(buffer_pb2.ClaimRequest(
                        replica_id=f"r{k}", max_groups=2, wait_seconds=0.5, restarted=f), timeout=5)

                reply, started = retry_timed(claim, dead)
                first = False
                if reply.tickets:
                    ledger.served(started)
                if reply.finished or over.is_set():
                    return
                with ledger.lock:
                    ledger.tickets.update(t.group_id for t in reply.tickets)
                for t in reply.tickets:
                    for i in range(t.group_size):
                        s = make_sample(t.group_id, i, t.group_size)
                        s.replica_id = f"r{k}"
                        try:
                            def put(s: sample_pb2.Sample = s) -> buffer_pb2.PutReply:
                                return stub().Put(buffer_pb2.PutRequest(samples=[s], wait_seconds=1), timeout=5)

                            started = retry_timed(put, dead)[1]
                        except grpc.RpcError as exc:     # as a replica does: a refused group is dropped
                            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                                raise
                            break
                        ledger.acked([f"{t.group_id}/{i}"])
                        ledger.served(started)
        return body

    def trainer(dead: threading.Event, n: int) -> None:
        records = read_records(cluster.run_dir)
        start = max(records, default=-1) + 1
        if start:
            retry(lambda: stub().Ack(buffer_pb2.AckRequest(committed_step=start - 1), timeout=5), dead)
            with ledger.lock:
                ledger.acks.add(start - 1)
        for step in range(start, steps):
            while True:
                def get_batch(st: int = step) -> buffer_pb2.Batch:
                    return stub().GetBatch(buffer_pb2.GetBatchRequest(
                        step=st, num_groups=GROUPS_PER_STEP, wait_seconds=0.5), timeout=5)

                batch, started = retry_timed(get_batch, dead)
                if batch.complete:
                    ledger.served(started)
                    break
            ids = [f"{s.group_id}/{s.index}" for s in batch.samples]
            time.sleep(step_seconds)              # the step's training
            with ledger.lock:
                if step in ledger.delivered and ledger.delivered[step] != ids:
                    ledger.notes.append(f"step {step} redelivered {ids}, first {ledger.delivered[step]}")
                ledger.delivered.setdefault(step, ids)
            if dead.is_set():
                raise Stop                        # killed between GetBatch and the record
            write_record(cluster.run_dir, step, ids)
            ledger.commit(step, ids)
            if dead.is_set():
                raise Stop                        # killed between the record and the Ack
            def ack(st: int = step) -> buffer_pb2.AckReply:
                return stub().Ack(buffer_pb2.AckRequest(committed_step=st), timeout=5)

            started = retry_timed(ack, dead)[1]
            with ledger.lock:
                ledger.acks.add(step)
            ledger.served(started)

    workers = {f"r{k}": Worker(f"r{k}", replica(k), errors) for k in range(REPLICAS)}
    the_trainer = Worker("trainer", trainer, errors)
    started = time.monotonic()
    try:
        for _ in range(faults):
            time.sleep(rng.uniform(0.1, 0.8))
            if the_trainer.finished.is_set():
                break
            kind = rng.choice(kinds)
            f = ledger.fault(kind)
            detail = ""
            if kind == "buffer_kill9":
                cluster.kill9(rng.uniform(0, 0.5), f)
            elif kind == "buffer_stop":
                cluster.freeze(cluster.pid, rng.uniform(0.5, 2.0))
            elif kind == "power_loss":
                detail = cluster.power_loss(ledger, rng, f)
            elif kind == "disk_full":
                cluster.disk_full(rng.uniform(1.0, 2.5))
            elif kind == "redis_kill9":
                assert cluster.redis is not None
                cluster.redis.kill9()
                time.sleep(rng.uniform(0, 0.5))
                f.ended = time.monotonic()
                cluster.redis.start()
            elif kind == "redis_power_loss":
                assert cluster.redis is not None
                try:
                    detail = redis_power_loss(cluster.redis, PREFIX, ledger, rng, f)
                except RuntimeError as exc:          # redis-server refused the AOF: the run cannot go on
                    errors.append(f"redis_power_loss: {exc}")
                    break
            elif kind == "redis_stop":
                assert cluster.redis is not None and cluster.redis.proc is not None
                cluster.freeze(cluster.redis.proc.pid, rng.uniform(0.5, 2.0))
            elif kind == "replica_kill":
                workers[rng.choice(sorted(workers))].kill()
            elif kind == "trainer_kill":
                the_trainer.kill()
            f.ended = f.ended or time.monotonic()
            injected.append((f, f"{f.ended - started:6.2f}s {kind} {detail}".rstrip()))
        if not the_trainer.finished.wait(180):
            errors.append("the trainer did not finish within 180 s")
        over.set()
        for w in workers.values():
            w.kill() if not w.finished.wait(20) else None
        stats = cluster.stats()
        ledger.dropped = dict(stats.dropped)
        cluster.stop_buffer()
        ledger.stored_at_end = cluster.stored_ids()
    finally:
        over.set()
        cluster.close()
    records = read_records(cluster.run_dir)
    errors.extend(ledger.trained_from(records, steps))
    ledger.notes.extend(errors)
    committed = list(ledger.committed.values())
    return check(ledger), [text + timing(f, committed) for f, text in injected]


def timing(f: Fault, committed: list[float]) -> str:
    """Seconds from the fault's injection to serving again and to the next step (tests.faults.ledger.next_step)."""
    def since(t: float) -> str:
        return f"{t - f.injected:.2f} s" if t else "never"

    silent = "; SILENT" if f.damage and not f.reported else ""
    return f" -> serving {since(f.serving)}, next step {since(next_step(f, committed))}{silent}"


def main() -> int:
    mode = argparse.ArgumentParser(add_help=False)
    mode.add_argument("--mode", choices=["thread", "run"], default="thread")
    known, rest = mode.parse_known_args()
    if known.mode == "run":
        from tests.faults.run_mode import main as run_main

        return run_main(rest)
    parser = argparse.ArgumentParser(description="seeded fault runs of the buffer service")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--store", choices=["embedded", "redis", "both"], default="both")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--faults", type=int, default=4)
    parser.add_argument("--kinds", default="", help="comma-separated fault kinds to draw from (default: all)")
    parser.add_argument("--table", action="store_true", help="print the markdown table per store and fault kind")
    args = parser.parse_args(rest)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    from tests.faults.ledger import summarize

    stores = ["embedded", "redis"] if args.store == "both" else [args.store]
    verdicts: dict[str, list[Verdict]] = {s: [] for s in stores}
    bad = 0
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        for store in stores:
            with tempfile.TemporaryDirectory() as tmp:
                pool = tuple(k for k in kinds if k in (EMBEDDED_FAULTS if store == "embedded" else REDIS_FAULTS))
                if kinds and not pool:
                    continue
                verdict, events = run_seed(seed, store, Path(tmp), args.steps, args.faults, kinds=pool or None)
            verdicts[store].append(verdict)
            print(f"seed {seed} {store}: {verdict.line()}  [{'; '.join(e.split(' ', 1)[1] for e in events)}]",
                  flush=True)
            if not verdict.ok:
                bad += 1
                print(f"  FAILED: lost {verdict.lost[:5]} twice {verdict.trained_twice[:5]} "
                      f"unexpected {verdict.unexpected[:5]}", flush=True)
    for store in stores:
        print(f"[{store}] " + summarize(verdicts[store]))
    if args.table:
        from tests.faults.report import markdown_table

        print(markdown_table(verdicts))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
