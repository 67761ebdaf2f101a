"""Device-machine check: CUDA tensors through the broadcast and NIXL weight transports, GB/s against a
device-to-device copy of the same bytes in the same run.

    python scripts/gpu_checks/weight_sync_check.py [--mb 1024] [--bucket-mb 256]

Broadcast: a trainer process and a replica process in the transport's own group (NCCL when each process has its
own GPU; gloo over CUDA tensors when both share one, since NCCL refuses two ranks on one device). NIXL: UCX WRITEs
VRAM -> VRAM between two processes (needs nixl-cu13 installed on the device machine). Every received version is
checked against every tensor hash. Prints one JSON line per measurement; exits non-zero if a transfer fails.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

if TYPE_CHECKING:
    from rlfleet.services.weight_sync.transports.contract import Receiver, Sender


def d2d_gbps(n: int, device: str) -> float:
    a = torch.ones(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        b.copy_(a)
    torch.cuda.synchronize()
    return 5 * n / (time.perf_counter() - t0) / 1e9


def params(mb: int, device: str) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator(device=device).manual_seed(0)
    out: list[tuple[str, torch.Tensor]] = []
    i = 0
    while sum(t.numel() * t.element_size() for _, t in out) < mb << 20:
        out.append((f"layers.{i}.weight", torch.randn(4096, 4096, generator=g, device=device).to(torch.bfloat16)))
        i += 1
    return out


def _trainer(kind: str, address: str, mb: int, bucket_mb: int, device: str, conn: Connection) -> None:
    from rlfleet.runtime.rpc import channel
    from rlfleet.services.weight_sync.transports.bucketed.sender import BucketedSender
    from rlfleet.services.weight_sync.transports.peers import PeerDirectory

    torch.cuda.set_device(torch.device(device))
    directory = PeerDirectory(channel(address, None))
    named = params(mb, device)
    sender: Sender
    if kind == "broadcast":
        from rlfleet.services.weight_sync.transports.broadcast.sender import BroadcastSender

        group_device = device if torch.cuda.device_count() > 1 else "cpu"
        sender = BroadcastSender(BucketedSender("127.0.0.1:0", None, bucket_mb << 20), directory.register, 1,
                                 device=group_device, join_seconds=120)
    else:
        from rlfleet.services.weight_sync.transports.nixl.sender import NixlSender

        sender = NixlSender(directory.peers, bucket_mb << 20, device=device, expected_replicas=1, wait_seconds=120)
    for v in (1, 2, 3):
        conn.recv()
        torch.cuda.synchronize()
        manifest = sender.stage(v, v, named)
        conn.send(manifest.SerializeToString())
    conn.recv()
    sender.close()


def run(kind: str, mb: int, bucket_mb: int) -> list[float]:
    from prometheus_client import CollectorRegistry

    from rlfleet.runtime.metrics import WeightSyncMetrics
    from rlfleet.runtime.rpc import Server, channel
    from rlfleet.services.weight_sync.board import VersionBoard
    from rlfleet.services.weight_sync.servicer import WeightSyncServicer
    from rlfleet.services.weight_sync.transports.peers import PeerDirectory
    from rlfleet.v1 import weight_sync_pb2_grpc, weights_pb2

    server = Server("127.0.0.1:0", None)
    server.add(weight_sync_pb2_grpc.add_WeightSyncServicer_to_server,
               WeightSyncServicer(VersionBoard(), WeightSyncMetrics(CollectorRegistry())), "rlfleet.v1.WeightSync")
    server.start()
    address = f"127.0.0.1:{server.port}"
    directory = PeerDirectory(channel(address, None))
    send_dev = "cuda:1" if torch.cuda.device_count() > 1 else "cuda:0"
    n = sum(t.numel() * t.element_size() for _, t in params(mb, "cuda:0"))
    receiver: Receiver
    if kind == "broadcast":
        from rlfleet.services.weight_sync.transports.broadcast.receiver import BroadcastReceiver

        group_device = "cuda:0" if torch.cuda.device_count() > 1 else "cpu"
        receiver = BroadcastReceiver(directory.peers, group_device, join_seconds=120)
    else:
        from rlfleet.services.weight_sync.transports.nixl.receiver import NixlReceiver

        receiver = NixlReceiver("gpu-check", n + (64 << 20), directory.register, "cuda:0")
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_trainer, args=(kind, address, mb, bucket_mb, send_dev, theirs))
    proc.start()
    rates = []
    for _ in range(3):
        ours.send("go")
        t0 = time.perf_counter()
        manifest = weights_pb2.WeightManifest.FromString(ours.recv())
        receiver.fetch(manifest, None, 600.0)                  # raises unless every hash matches
        rates.append(n / (time.perf_counter() - t0) / 1e9)
    ours.send("done")
    proc.join(120)
    server.stop(0)
    return rates


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--bucket-mb", type=int, default=256)
    ap.add_argument("--only", default="broadcast,nixl")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device"}))
        return 2
    n = args.mb << 20
    print(json.dumps({"check": "d2d_copy", "gbps": round(d2d_gbps(n, "cuda:0"), 1), "bytes": n}), flush=True)
    failed = 0
    for kind in args.only.split(","):
        try:
            rates = run(kind, args.mb, args.bucket_mb)
            print(json.dumps({"check": kind, "gbps": [round(r, 2) for r in rates], "bytes": n}), flush=True)
        except Exception as exc:  # noqa: BLE001 - report and go on to the next check
            failed += 1
            print(json.dumps({"check": kind, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
