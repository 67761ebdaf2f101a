"""Buffer put -> get -> ack throughput and latency, against raw Redis Streams in the same run. Prints, never asserts.

For 1 KiB and 64 KiB samples: the real buffer service (`python -m services.buffer` in a subprocess, gRPC, each
store) with one producer thread (Claim + Put per group) and one consumer thread (GetBatch + Ack per step), and the
baseline: raw redis-py pipelined XADD of the same payloads + XREADGROUP + XACK on a private redis-server.
Run: python bench/buffer_throughput.py [--groups-1k 250] [--groups-64k 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import redis
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlfleet.rpc import channel, wait_healthy  # noqa: E402
from rlfleet.v1 import buffer_pb2, buffer_pb2_grpc, sample_pb2  # noqa: E402
from tests.support.redis_server import RedisServer, free_port  # noqa: E402

GROUP_SIZE = 8


def payload_sample(gid: str, index: int, prompt_index: int, size: int) -> sample_pb2.Sample:
    t = max(1, (size - 64) // 9)                     # 4 B id + 1 B mask + 4 B logprob per token
    return sample_pb2.Sample(group_id=gid, index=index, group_size=GROUP_SIZE, prompt_index=prompt_index,
                             prompt_ids=np.arange(8, dtype="<i4").tobytes(),
                             response_ids=np.arange(t, dtype="<i4").tobytes(), loss_mask=np.ones(t, "u1").tobytes(),
                             rollout_logprobs=np.full(t, -0.5, "<f4").tobytes(), reward=float(index),
                             status=sample_pb2.SAMPLE_STATUS_COMPLETED)


def report(name: str, samples: int, seconds: float | None, latencies: list[float]) -> float:
    """Print samples/s (when seconds is given) and put->get latency percentiles; return samples/s."""
    rate = samples / seconds if seconds else 0.0
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    shown = f"{rate:9.0f} samples/s" if seconds else f"{'':>19}"
    print(f"  {name:<34} {shown}   put->get p50 {q[49] * 1e3:7.2f} ms  p99 {q[98] * 1e3:7.2f} ms")
    return rate


def run_service(work: Path, store: str, redis_url: str, size: int, groups: int, serial: int) -> float:
    port = free_port()
    run_dir = work / f"run-{store}-{size}"
    cfg = {"run": {"name": f"bench{size}", "dir": str(run_dir)}, "model": {"path": "x"},
           "rollout": {"data_source": "a:b", "reward_fn": "a:b", "group_size": GROUP_SIZE},
           "buffer": {"store": store, "redis_url": redis_url, "capacity": 64 * GROUP_SIZE, "max_staleness": 10 ** 6,
                      "min_valid_per_group": 1, "fsync": "everysec"},
           "trainer": {"steps": groups + serial, "groups_per_step": 1}, "security": {"mode": "none"},
           "endpoints": {"buffer": f"127.0.0.1:{port}"}}
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen([sys.executable, "-m", "services.buffer", "--config", str(run_dir / "config.yaml")],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(f"127.0.0.1:{port}", timeout=30)
        stub = buffer_pb2_grpc.BufferStub(channel(f"127.0.0.1:{port}", None))
        started: dict[str, float] = {}

        def put_group(t: buffer_pb2.GroupTicket) -> None:
            samples = [payload_sample(t.group_id, i, t.prompt_index, size) for i in range(t.group_size)]
            started[t.group_id] = time.perf_counter()
            stub.Put(buffer_pb2.PutRequest(samples=samples, wait_seconds=5), timeout=30)

        def produce() -> None:
            left = groups
            while left:
                reply = stub.Claim(buffer_pb2.ClaimRequest(replica_id="bench", max_groups=min(4, left),
                                                           wait_seconds=5), timeout=10)
                for t in reply.tickets:
                    put_group(t)
                left -= len(reply.tickets)

        def consume(steps: range) -> list[float]:
            out = []
            for step in steps:
                batch = stub.GetBatch(buffer_pb2.GetBatchRequest(step=step, num_groups=1, wait_seconds=10),
                                      timeout=30)
                out.append(time.perf_counter() - started[batch.group_ids[0]])
                stub.Ack(buffer_pb2.AckRequest(committed_step=step), timeout=10)
            return out

        t0 = time.perf_counter()
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        latencies = consume(range(groups))
        elapsed = time.perf_counter() - t0
        producer.join(10)
        rate = report(f"buffer[{store}] streaming", groups * GROUP_SIZE, elapsed, latencies)
        idle = []
        for step in range(groups, groups + serial):      # one group at a time: no queue in front of it
            put_group(stub.Claim(buffer_pb2.ClaimRequest(replica_id="bench", max_groups=1), timeout=10).tickets[0])
            idle.extend(consume(range(step, step + 1)))
        report(f"buffer[{store}] idle, one group", serial * GROUP_SIZE, None, idle)
        return rate
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def run_raw_redis(url: str, size: int, groups: int) -> float:
    r = redis.Redis.from_url(url)
    key = f"bench:raw:{size}"
    r.delete(key)
    r.xgroup_create(key, "g", id="0", mkstream=True)
    data = [payload_sample(f"g{g}", i, g, size).SerializeToString() for g in range(4) for i in range(GROUP_SIZE)]
    started: dict[int, float] = {}
    latencies: list[float] = []

    def produce() -> None:
        w = redis.Redis.from_url(url)
        for g in range(groups):
            started[g] = time.perf_counter()
            pipe = w.pipeline(transaction=False)
            for i in range(GROUP_SIZE):
                pipe.xadd(key, {"g": g, "i": i, "d": data[(g % 4) * GROUP_SIZE + i]})
            pipe.execute()

    t0 = time.perf_counter()
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    got = 0
    while got < groups * GROUP_SIZE:
        reply = r.xreadgroup("g", "c", {key: ">"}, count=GROUP_SIZE, block=5000)
        entries = reply[0][1] if reply else []
        if not entries:
            continue
        now = time.perf_counter()
        latencies.extend(now - started[int(f[b"g"])] for _, f in entries if int(f[b"i"]) == GROUP_SIZE - 1)
        pipe = r.pipeline(transaction=False)
        pipe.xack(key, "g", *[e[0] for e in entries])
        pipe.xdel(key, *[e[0] for e in entries])
        pipe.execute()
        got += len(entries)
    elapsed = time.perf_counter() - t0
    producer.join(10)
    r.delete(key)
    return report("raw redis streams", got, elapsed, latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups-1k", type=int, default=250, help="groups of 8 samples at 1 KiB")
    parser.add_argument("--groups-64k", type=int, default=50, help="groups of 8 samples at 64 KiB")
    parser.add_argument("--serial", type=int, default=30, help="groups sent one at a time (idle latency)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        server = RedisServer(work / "redis").start()
        try:
            for size, groups in ((1024, args.groups_1k), (64 * 1024, args.groups_64k)):
                print(f"{size // 1024} KiB samples, {groups} groups of {GROUP_SIZE} (put -> get -> ack):")
                raw = run_raw_redis(server.url, size, groups)
                for store in ("embedded", "redis"):
                    rate = run_service(work, store, server.url, size, groups, args.serial)
                    print(f"  {'':<34} streaming ratio to raw redis: {rate / raw:.2f}")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
