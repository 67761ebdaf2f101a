"""Buffer put -> get -> ack throughput and latency, against raw Redis Streams in the same run. Prints, never asserts.

For 1 KiB and 64 KiB samples: the real buffer service (`python -m rlfleet.services.buffer` in a subprocess, gRPC, each
store at each durability: embedded log with fsync everysec and with fsync always (the default: every reply waits
for its commit's fsync, concurrent Puts share one fsync), Redis with AOF appendfsync everysec and always, set with
CONFIG SET on the same server) fed by producer threads (Claim, then one Put per
`--put-groups` groups) and drained by one consumer thread (GetBatch of `--step-groups` groups per trainer step, then
Ack); and the baseline: raw redis-py on a private redis-server with the same payloads and the same batching: each
producer thread sends one pipeline of XADDs per `--put-groups` groups, the consumer reads with XREADGROUP COUNT
8*`--step-groups` and pipelines XACK+XDEL. Payloads are serialized Samples built before the clock starts, on both
sides. Every round runs raw, then each store and durability back to back, so each ratio compares runs seconds
apart (`always vs everysec` is the cost of acknowledged-means-on-disk; group commit needs concurrent producers:
try --producers 8); with
`--rounds` > 1 the medians are printed too (the machine is shared: read the medians).

Client paths (`--paths`, each run back to back in every round, so each one's ratio is same-run): `old` Puts
PutRequest messages and calls Ack after every GetBatch; `fold` folds each step's Ack into the next GetBatch
(`ack_through_step`); `new` also frames each Put from the serialized samples (rlfleet.sample.put_wire), as the rollout
replica does. Server-side changes (batched sample validation) apply to every path.

Latency: `streaming` is put->get while the buffer runs full (mostly queueing: up to `capacity` samples wait ahead
of a new group); `idle` sends one group at a time and takes it at once, which is the buffer's own put->get time.
Run: python bench/buffer_throughput.py [--rounds 3] [--groups-1k 256] [--groups-64k 64] [--put-groups 1]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import redis
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlfleet.runtime.rpc import channel, wait_healthy  # noqa: E402
from rlfleet.sample.put_wire import encode_put_request, raw_put  # noqa: E402
from rlfleet.v1 import buffer_pb2, buffer_pb2_grpc, sample_pb2  # noqa: E402
from tests.support.redis_server import RedisServer, free_port  # noqa: E402

GROUP_SIZE = 8
CAPACITY_GROUPS = 64


def payload_sample(gid: str, index: int, prompt_index: int, size: int) -> sample_pb2.Sample:
    t = max(1, (size - 64) // 9)                     # 4 B id + 1 B mask + 4 B logprob per token
    return sample_pb2.Sample(group_id=gid, index=index, group_size=GROUP_SIZE, prompt_index=prompt_index,
                             prompt_ids=np.arange(8, dtype="<i4").tobytes(),
                             response_ids=np.arange(t, dtype="<i4").tobytes(), loss_mask=np.ones(t, "u1").tobytes(),
                             rollout_logprobs=np.full(t, -0.5, "<f4").tobytes(), reward=float(index),
                             status=sample_pb2.SAMPLE_STATUS_COMPLETED)


def group_samples(prompt_index: int, size: int) -> list[sample_pb2.Sample]:
    return [payload_sample(f"g{prompt_index}", i, prompt_index, size) for i in range(GROUP_SIZE)]


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of a process (this one when pid is None), all its threads."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU used by the bench client and the given processes between start() and stop(): noise-robust cost."""

    def __init__(self, **pids: int) -> None:
        self.pids = pids

    def start(self) -> None:
        self.t0 = {"client": cpu_seconds(), **{k: cpu_seconds(p) for k, p in self.pids.items()}}

    def stop(self) -> dict[str, float]:
        now = {"client": cpu_seconds(), **{k: cpu_seconds(p) for k, p in self.pids.items()}}
        return {k: now[k] - self.t0[k] for k in now}


def quantiles(latencies: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return q[49] * 1e3, q[98] * 1e3


def report(name: str, rate: float | None, latencies: list[float], cpu: dict[str, float] | None = None,
           samples: int = 0) -> float:
    """Print samples/s (when given), put->get latency percentiles and CPU ms per 1000 samples; return the latter."""
    p50, p99 = quantiles(latencies)
    shown = f"{rate:9.0f} samples/s" if rate is not None else f"{'':>19}"
    per_k = sum(cpu.values()) / samples * 1e6 if cpu and samples else 0.0
    parts = " ".join(f"{k} {v / samples * 1e6:.0f}" for k, v in cpu.items()) if cpu and samples else ""
    tail = f"   cpu {per_k:6.0f} ms/1k samples ({parts})" if parts else ""
    print(f"  {name:<34} {shown}   put->get p50 {p50:7.2f} ms  p99 {p99:7.2f} ms{tail}", flush=True)
    return per_k


class Args:
    groups_1k: int
    groups_64k: int
    rounds: int
    stores: str
    put_groups: int
    claim_groups: int
    step_groups: int
    producers: int
    serial: int
    paths: str


def spread(groups: int, producers: int, work: Callable[[Callable[[], int | None]], None]) -> list[threading.Thread]:
    """Start `producers` threads running work(next_group); next_group() hands out 0..groups-1, then None."""
    counter, lock = itertools.count(), threading.Lock()

    def next_group() -> int | None:
        with lock:
            g = next(counter)
        return g if g < groups else None

    threads = [threading.Thread(target=work, args=(next_group,), daemon=True) for _ in range(producers)]
    for t in threads:
        t.start()
    return threads


# the Redis runs set redis-server's appendfsync to `fsync`: the buffer must be told it may run on a weaker one
REDIS_DURABILITY = {"always": "always", "everysec": "everysec_loses_1s"}


def start_service(work: Path, store: str, redis_url: str, size: int, steps: int, step_groups: int,
                  fsync: str = "always") -> tuple[subprocess.Popen, str]:
    port = free_port()
    run_dir = work / f"run-{store}-{size}-{port}"
    cfg = {"run": {"name": f"bench{size}-{port}", "dir": str(run_dir)}, "model": {"path": "x"},
           "rollout": {"data_source": "a:b", "reward_fn": "a:b", "group_size": GROUP_SIZE},
           "buffer": {"store": store, "redis_url": redis_url, "capacity": CAPACITY_GROUPS * GROUP_SIZE,
                      "max_staleness": 10 ** 6, "min_valid_per_group": 1, "fsync": fsync,
                      "redis_durability": REDIS_DURABILITY.get(fsync, "unchecked_may_lose_writes")},
           "trainer": {"steps": steps, "groups_per_step": step_groups}, "security": {"mode": "none"},
           "endpoints": {"buffer": f"127.0.0.1:{port}"}}
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen([sys.executable, "-m", "rlfleet.services.buffer", "--config", str(run_dir / "config.yaml")],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.DEVNULL)
    wait_healthy(f"127.0.0.1:{port}", timeout=60)
    return proc, f"127.0.0.1:{port}"


Result = tuple[float, list[float], list[float], dict[str, float], int]


def run_service(work: Path, store: str, redis_url: str, redis_pid: int, size: int, groups: int, a: Args,
                fsync: str = "always", path: str = "new") -> Result:
    """(samples/s, streaming latencies, idle latencies, CPU seconds by process, samples) of the buffer on a store;
    fsync: the embedded log's policy, or Redis's appendfsync. path: old (PutRequest messages, an Ack call after
    every GetBatch), fold (the same Puts, each step's Ack folded into the next GetBatch: ack_through_step; the last
    step's by Ack) or new (fold, and Puts framed from serialized samples: rlfleet.sample.put_wire)."""
    new, fold = path == "new", path in ("fold", "new")
    if store == "redis":
        redis.Redis.from_url(redis_url).config_set("appendfsync", fsync)
    steps = groups // a.step_groups
    payloads = {g: group_samples(g, size) for g in range(steps * a.step_groups + a.serial * a.step_groups)}
    serialized = {g: [m.SerializeToString() for m in ms] for g, ms in payloads.items()}
    proc, address = start_service(work, store, redis_url, size, steps + a.serial, a.step_groups, fsync)
    try:
        chan = channel(address, None)
        stub, put_raw = buffer_pb2_grpc.BufferStub(chan), raw_put(chan)
        started: dict[str, float] = {}

        def put(tickets: list[buffer_pb2.GroupTicket]) -> None:
            now = time.perf_counter()
            started.update((t.group_id, now) for t in tickets)
            if new:
                put_raw(encode_put_request([s for t in tickets for s in serialized[t.prompt_index]], 5), timeout=30)
                return
            samples = [s for t in tickets for s in payloads[t.prompt_index]]
            stub.Put(buffer_pb2.PutRequest(samples=samples, wait_seconds=5), timeout=30)

        def produce(next_group: Callable[[], int | None]) -> None:
            # like a rollout replica: claim up to claim_groups tickets at once, Put put_groups groups per call
            while want := sum(1 for _ in range(max(a.claim_groups, a.put_groups)) if next_group() is not None):
                tickets: list[buffer_pb2.GroupTicket] = []
                while len(tickets) < want:
                    reply = stub.Claim(buffer_pb2.ClaimRequest(replica_id="bench", max_groups=want - len(tickets),
                                                               wait_seconds=5), timeout=10)
                    tickets.extend(reply.tickets)
                for i in range(0, len(tickets), a.put_groups):
                    put(tickets[i:i + a.put_groups])

        def consume(steps_: range, last: bool = False) -> list[float]:
            """last: the run's last steps, so the final one is acked by an Ack call."""
            out: list[float] = []
            for step in steps_:
                req = buffer_pb2.GetBatchRequest(step=step, num_groups=a.step_groups, wait_seconds=10)
                if fold and step > 0:
                    req.ack_through_step = step - 1
                batch = stub.GetBatch(req, timeout=30)
                now = time.perf_counter()
                out.extend(now - started[gid] for gid in batch.group_ids)
                if not fold or (last and step == steps_[-1]):
                    stub.Ack(buffer_pb2.AckRequest(committed_step=step), timeout=10)
            return out

        meter = CpuMeter(server=proc.pid, **({"redis": redis_pid} if store == "redis" else {}))
        meter.start()
        t0 = time.perf_counter()
        producers = spread(steps * a.step_groups, a.producers, produce)
        latencies = consume(range(steps))
        elapsed = time.perf_counter() - t0
        for t in producers:
            t.join(10)
        cpu = meter.stop()
        idle = []
        for step in range(steps, steps + a.serial):      # one step at a time: no queue in front of it
            put(list(stub.Claim(buffer_pb2.ClaimRequest(replica_id="bench", max_groups=a.step_groups),
                                timeout=10).tickets))
            idle.extend(consume(range(step, step + 1), last=step == steps + a.serial - 1))
        n = steps * a.step_groups * GROUP_SIZE
        return n / elapsed, latencies, idle, cpu, n
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def run_raw_redis(url: str, redis_pid: int, size: int, groups: int, a: Args) -> Result:
    """The same shape on raw Redis Streams."""
    r = redis.Redis.from_url(url)
    r.config_set("appendfsync", "everysec")
    key = f"bench:raw:{size}"
    r.delete(key)
    r.xgroup_create(key, "g", id="0", mkstream=True)
    steps = groups // a.step_groups
    payloads = {g: [m.SerializeToString() for m in group_samples(g, size)]
                for g in range(steps * a.step_groups + a.serial * a.step_groups)}
    started: dict[int, float] = {}

    def put(w: redis.Redis, gs: list[int]) -> None:
        pipe = w.pipeline(transaction=False)
        now = time.perf_counter()
        started.update((g, now) for g in gs)
        for g in gs:
            for i, data in enumerate(payloads[g]):
                pipe.xadd(key, {"g": g, "i": i, "d": data})
        pipe.execute()

    def produce(next_group: Callable[[], int | None]) -> None:
        w = redis.Redis.from_url(url)
        while True:
            gs = [g for g in (next_group() for _ in range(a.put_groups)) if g is not None]
            if not gs:
                return
            put(w, gs)

    def consume(samples: int) -> list[float]:
        got = 0
        out: list[float] = []
        while got < samples:
            reply = r.xreadgroup("g", "c", {key: ">"}, count=GROUP_SIZE * a.step_groups, block=5000)
            entries = reply[0][1] if reply else []
            if not entries:
                continue
            now = time.perf_counter()
            out.extend(now - started[int(f[b"g"])] for _, f in entries if int(f[b"i"]) == GROUP_SIZE - 1)
            pipe = r.pipeline(transaction=False)
            pipe.xack(key, "g", *[e[0] for e in entries])
            pipe.xdel(key, *[e[0] for e in entries])
            pipe.execute()
            got += len(entries)
        return out

    meter = CpuMeter(redis=redis_pid)
    meter.start()
    t0 = time.perf_counter()
    producers = spread(steps * a.step_groups, a.producers, produce)
    latencies = consume(steps * a.step_groups * GROUP_SIZE)
    elapsed = time.perf_counter() - t0
    for t in producers:
        t.join(10)
    cpu = meter.stop()
    idle = []
    for step in range(steps, steps + a.serial):
        put(r, list(range(step * a.step_groups, (step + 1) * a.step_groups)))
        idle.extend(consume(a.step_groups * GROUP_SIZE))
    r.delete(key)
    n = steps * a.step_groups * GROUP_SIZE
    return n / elapsed, latencies, idle, cpu, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups-1k", type=int, default=256, help="groups of 8 samples at 1 KiB, per run (0: skip)")
    parser.add_argument("--groups-64k", type=int, default=64, help="groups of 8 samples at 64 KiB, per run (0: skip)")
    parser.add_argument("--serial", type=int, default=30, help="steps sent one at a time (idle latency)")
    parser.add_argument("--rounds", type=int, default=1, help="raw, embedded, redis this many times; medians")
    parser.add_argument("--put-groups", type=int, default=1, help="groups per Put (per XADD pipeline)")
    parser.add_argument("--claim-groups", type=int, default=4, help="tickets per Claim (buffer side only)")
    parser.add_argument("--step-groups", type=int, default=1, help="groups per GetBatch (per XREADGROUP)")
    parser.add_argument("--producers", type=int, default=1, help="producer threads (replicas) on both sides")
    parser.add_argument("--stores", default="embedded,redis", help="buffer stores to run (comma-separated)")
    parser.add_argument("--paths", default="old,fold,new",
                        help="client paths to run: old (PutRequest messages, GetBatch then Ack), fold (the Ack folded "
                             "into the next GetBatch), new (fold, and Puts framed from serialized samples)")
    args = parser.parse_args(namespace=Args())
    print(f"batching: {args.put_groups} group(s) of {GROUP_SIZE} per Put / XADD pipeline, {args.producers} "
          f"producer(s), {args.claim_groups} tickets per Claim; {args.step_groups} group(s) per GetBatch+Ack / "
          "XREADGROUP+XACK", flush=True)
    ratios: dict[tuple[int, str], list[tuple[float, float]]] = {}
    durable: dict[tuple[int, str], list[float]] = {}          # always / everysec samples/s, same round
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        server = RedisServer(work / "redis").start()
        assert server.proc is not None
        try:
            for rnd in range(args.rounds):
                for size, groups in ((1024, args.groups_1k), (64 * 1024, args.groups_64k)):
                    if groups <= 0:                  # --groups-1k 0 or --groups-64k 0: that size is skipped
                        continue
                    print(f"round {rnd + 1}: {size // 1024} KiB samples, {groups} groups of {GROUP_SIZE} "
                          "(put -> get -> ack):", flush=True)
                    raw, lat, idle, cpu, n = run_raw_redis(server.url, server.proc.pid, size, groups, args)
                    raw_cpu = report("raw redis streams", raw, lat, cpu, n)
                    report("raw redis idle, one step", None, idle)
                    for store in args.stores.split(","):
                        rates: dict[str, float] = {}
                        for fsync in ("everysec", "always"):
                            for path in args.paths.split(","):
                                name = f"{store}/{fsync} {path}"
                                rate, lat, idle, cpu, n = run_service(work, store, server.url, server.proc.pid,
                                                                      size, groups, args, fsync, path)
                                rates[f"{fsync} {path}"] = rate
                                buf_cpu = report(f"buffer[{name}] streaming", rate, lat, cpu, n)
                                report(f"buffer[{name}] idle, one step", None, idle)
                                ratios.setdefault((size, name), []).append((rate / raw, raw_cpu / buf_cpu))
                                print(f"  {'':<34} ratio to raw redis: {rate / raw:.2f} samples/s, "
                                      f"{raw_cpu / buf_cpu:.2f} by CPU per sample", flush=True)
                            for path in args.paths.split(","):
                                if path != "old" and f"{fsync} old" in rates:
                                    print(f"  {'':<34} buffer[{store}/{fsync}] {path} vs old path: "
                                          f"{rates[f'{fsync} {path}'] / rates[f'{fsync} old']:.2f}x samples/s",
                                          flush=True)
                        for path in args.paths.split(","):
                            ratio = rates[f"always {path}"] / rates[f"everysec {path}"]
                            durable.setdefault((size, f"{store} {path}"), []).append(ratio)
                            print(f"  {'':<34} buffer[{store} {path}] always vs everysec: {ratio:.2f}x samples/s",
                                  flush=True)
        finally:
            server.stop()
    print("acknowledged-means-on-disk cost, always / everysec samples/s (median over rounds; each round):")
    for (size, store), values in durable.items():
        print(f"  {size // 1024:>2} KiB buffer[{store}]: {statistics.median(values):.2f} "
              f"({', '.join(f'{v:.2f}' for v in values)})")
    if args.rounds > 1:
        print("median ratio to raw redis over rounds (samples/s; CPU per sample):")
        for (size, store), pairs in ratios.items():
            rate_ratios, cpus = [v[0] for v in pairs], [v[1] for v in pairs]
            print(f"  {size // 1024:>2} KiB buffer[{store}]: {statistics.median(rate_ratios):.2f} "
                  f"({', '.join(f'{v:.2f}' for v in rate_ratios)});  {statistics.median(cpus):.2f} "
                  f"({', '.join(f'{v:.2f}' for v in cpus)})")


if __name__ == "__main__":
    main()
