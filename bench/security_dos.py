"""Denial-of-service figures for the buffer as a real process (python -m rlfleet.services.buffer), mTLS and token mode.

1. RSS of the buffer before and after three concurrent unauthenticated 200 MiB Put requests (mTLS: refused at the
   handshake; token mode: refused by the 32 MiB server receive limit before the body is read).
2. Stats and GetBatch latency (p50/max over 20 calls) with no load, then while 200 long-poll Claims from 200
   distinct replica identities wait (the long-poll cap and per-caller cap keep threads for the trainer).

Usage: PYTHONPATH=$PWD python bench/security_dos.py   (a loaded machine: read the ratios against the same-run idle)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import yaml

from rlfleet.runtime.ports import free_ports
from rlfleet.runtime.rpc import channel, wait_healthy
from rlfleet.security.identity import load_identity
from rlfleet.security.pki import create_run_pki
from rlfleet.v1 import buffer_pb2, buffer_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
REPLICAS = 200
BIG = 200 * 2**20


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_buffer(run: Path, security: dict) -> tuple[subprocess.Popen, str]:
    port = free_ports(1)[0]
    cfg = {"run": {"name": "dos", "dir": str(run)}, "model": {"path": str(run / "no-model")},
           "rollout": {"data_source": "a:b", "reward_fn": "a:b", "group_size": 2, "replicas": REPLICAS},
           "buffer": {"capacity": 4, "max_staleness": 100, "min_valid_per_group": 1},   # 2 groups: then Claims wait
           "trainer": {"steps": 1000, "groups_per_step": 1}, "security": security,
           "endpoints": {"buffer": f"127.0.0.1:{port}"}}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RLFLEET_IDENTITY": "buffer"}
    proc = subprocess.Popen([sys.executable, "-m", "rlfleet.services.buffer", "--config", str(run / "config.yaml")],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=(run / "buffer.log").open("w"))
    return proc, f"127.0.0.1:{port}"


def flood(address: str, make_channel: Callable[[], grpc.Channel]) -> list[str]:
    body = buffer_pb2.PutRequest()
    body.samples.add(group_id="g0", index=0, group_size=2, prompt_ids=b"\0" * BIG)
    raw = body.SerializeToString()
    codes: list[str] = []

    def one() -> None:
        with make_channel() as ch:
            call = ch.unary_unary("/rlfleet.v1.Buffer/Put", request_serializer=lambda b: b,
                                  response_deserializer=lambda b: b)
            try:
                call(raw, timeout=30)
                codes.append("OK")
            except grpc.RpcError as exc:
                codes.append(exc.code().name)

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes


def latencies(stub: buffer_pb2_grpc.BufferStub, n: int = 20) -> tuple[float, float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        stub.Stats(buffer_pb2.StatsRequest(), timeout=10)
        stub.GetBatch(buffer_pb2.GetBatchRequest(step=0, policy_version=0, wait_seconds=0), timeout=10)
        out.append((time.perf_counter() - t0) * 1000 / 2)
    return statistics.median(out), max(out)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "mtls"
        run.mkdir()
        pki = create_run_pki(run / "pki", [("buffer", "buffer"), ("trainer", "trainer-0")]
                             + [("rollout", f"rollout-{i}") for i in range(REPLICAS)])
        proc, address = start_buffer(run, {"mode": "mtls", "pki_dir": str(pki)})
        trainer = load_identity(pki, "trainer-0")
        try:
            wait_healthy(address, 60, token=trainer)
            time.sleep(1.0)
            before = rss_mb(proc.pid)
            plain = flood(address, lambda: grpc.insecure_channel(address, options=[
                ("grpc.max_send_message_length", 2**30)]))
            no_cert = flood(address, lambda: grpc.secure_channel(address, grpc.ssl_channel_credentials(
                trainer.ca_pem), options=[("grpc.max_send_message_length", 2**30)]))
            after = rss_mb(proc.pid)
            print(f"mtls buffer RSS {before:.1f} MB -> {after:.1f} MB (+{after - before:.1f} MB) after 3x200 MiB "
                  f"without credential {plain} and 3x200 MiB TLS without client certificate {no_cert}")
            tstub = buffer_pb2_grpc.BufferStub(channel(address, trainer))
            idle = latencies(tstub)
            r0 = buffer_pb2_grpc.BufferStub(channel(address, load_identity(pki, "rollout-0")))
            r0.Claim(buffer_pb2.ClaimRequest(replica_id="rollout-0", max_groups=64), timeout=10)  # fill capacity
            chans = [channel(address, load_identity(pki, f"rollout-{i}")) for i in range(REPLICAS)]
            futures = [buffer_pb2_grpc.BufferStub(c).Claim.future(
                buffer_pb2.ClaimRequest(replica_id=f"rollout-{i}", max_groups=1, wait_seconds=20), timeout=25)
                for i, c in enumerate(chans)]
            time.sleep(3.0)
            loaded = latencies(tstub)
            codes: dict[str, int] = {}
            for f in futures:
                try:
                    reply = f.result()
                    k = f"OK ({len(reply.tickets)} tickets: {reply.reason[:40]})"
                except grpc.RpcError as exc:
                    k = exc.code().name
                codes[k] = codes.get(k, 0) + 1
            print(f"Stats/GetBatch latency idle p50 {idle[0]:.2f} ms max {idle[1]:.2f} ms; during {REPLICAS} "
                  f"long-poll Claims p50 {loaded[0]:.2f} ms max {loaded[1]:.2f} ms (x{loaded[0] / idle[0]:.2f} p50); "
                  f"Claims ended {codes}")
        finally:
            proc.terminate()
            proc.wait(30)
        run = Path(tmp) / "token"
        run.mkdir()
        (run / "token").write_text("t" * 32)
        proc, address = start_buffer(run, {"mode": "token", "token_file": str(run / "token")})
        try:
            wait_healthy(address, 60)
            time.sleep(1.0)
            before = rss_mb(proc.pid)
            codes_t = flood(address, lambda: grpc.insecure_channel(address, options=[
                ("grpc.max_send_message_length", 2**30)]))
            after = rss_mb(proc.pid)
            print(f"token buffer RSS {before:.1f} MB -> {after:.1f} MB (+{after - before:.1f} MB) after 3x200 MiB "
                  f"without the token {codes_t}")
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
