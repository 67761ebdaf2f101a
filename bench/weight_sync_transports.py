"""Broadcast and NIXL transports, GB/s across two processes against a plain memory copy of the same bytes; and
disk-delta bytes per update after one real AdamW step at lr 1e-6 in bf16, with its apply time against a full
safetensors load.

    python bench/weight_sync_transports.py [--mb 1024] [--bucket-mb 256] [--skip broadcast,nixl,delta]

The trainer side runs in a child process (stage = gather into buckets + send); this process is the replica and
times from the first byte it waits for to tensors checked against every hash. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlfleet.runtime.rpc import Server, channel  # noqa: E402
from rlfleet.services.weight_sync.board import VersionBoard  # noqa: E402
from rlfleet.services.weight_sync.servicer import WeightSyncServicer  # noqa: E402
from rlfleet.services.weight_sync.transports.contract import Receiver, Sender  # noqa: E402
from rlfleet.services.weight_sync.transports.peers import PeerDirectory  # noqa: E402
from rlfleet.v1 import weight_sync_pb2_grpc  # noqa: E402


def make_params(total_mb: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> list[tuple[str, torch.Tensor]]:
    """[2048, 2048] matrices (8 MiB in bf16) plus a norm vector each, until total_mb."""
    g = torch.Generator().manual_seed(seed)
    out: list[tuple[str, torch.Tensor]] = []
    i = 0
    while sum(t.numel() * t.element_size() for _, t in out) < total_mb << 20:
        out.append((f"layers.{i}.weight", (torch.randn(2048, 2048, generator=g) * 0.02).to(dtype)))
        out.append((f"layers.{i}.norm", torch.ones(2048, dtype=dtype)))
        i += 1
    return out


def nbytes(params: list[tuple[str, torch.Tensor]]) -> int:
    return sum(t.numel() * t.element_size() for _, t in params)


def memcpy_gbps(n: int) -> float:
    a, b = torch.ones(n, dtype=torch.uint8), torch.empty(n, dtype=torch.uint8)
    b.copy_(a)
    t0 = time.perf_counter()
    b.copy_(a)
    return n / (time.perf_counter() - t0) / 1e9


class Plane:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        from rlfleet.runtime.metrics import WeightSyncMetrics

        self.server = Server("127.0.0.1:0", None)
        self.server.add(weight_sync_pb2_grpc.add_WeightSyncServicer_to_server,
                        WeightSyncServicer(VersionBoard(), WeightSyncMetrics(CollectorRegistry())),
                        "rlfleet.v1.WeightSync")
        self.server.start()
        self.address = f"127.0.0.1:{self.server.port}"
        self.directory = PeerDirectory(channel(self.address, None))


def _sender(kind: str, address: str, mb: int, bucket_mb: int, versions: int, conn: Connection) -> None:
    from rlfleet.services.weight_sync.transports.bucketed.sender import BucketedSender

    torch.set_num_threads(1)
    directory = PeerDirectory(channel(address, None))
    params = make_params(mb, 0)
    sender: Sender
    if kind == "broadcast":
        from rlfleet.services.weight_sync.transports.broadcast.sender import BroadcastSender

        sender = BroadcastSender(BucketedSender("127.0.0.1:0", None, bucket_mb << 20), directory.register, 1,
                                 join_seconds=120)
    else:
        from rlfleet.services.weight_sync.transports.nixl.sender import NixlSender

        sender = NixlSender(directory.peers, bucket_mb << 20, expected_replicas=1, wait_seconds=120)
    for v in range(1, versions + 1):
        conn.recv()                                            # replica ready
        t0 = time.perf_counter()
        manifest = sender.stage(v, v, params)
        conn.send((manifest.SerializeToString(), time.perf_counter() - t0))
    conn.recv()
    sender.close()


def bench_transport(kind: str, mb: int, bucket_mb: int, versions: int) -> list[float]:
    from rlfleet.v1 import weights_pb2

    plane = Plane()
    params = make_params(mb, 0)
    n = nbytes(params)
    receiver: Receiver
    if kind == "broadcast":
        from rlfleet.services.weight_sync.transports.broadcast.receiver import BroadcastReceiver

        receiver = BroadcastReceiver(plane.directory.peers, join_seconds=120)
    else:
        from rlfleet.services.weight_sync.transports.layout import TensorSpec, plan
        from rlfleet.services.weight_sync.transports.nixl.receiver import NixlReceiver

        specs = [TensorSpec(k, "bfloat16", tuple(t.shape), t.numel() * 2) for k, t in params]
        receiver = NixlReceiver("bench", plan(specs, bucket_mb << 20).total_bytes, plane.directory.register)
    ours, theirs = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=_sender, args=(kind, plane.address, mb, bucket_mb, versions, theirs))
    proc.start()
    rates = []
    for _ in range(versions):
        ours.send("ready")
        t0 = time.perf_counter()
        raw, stage_s = ours.recv()
        manifest = weights_pb2.WeightManifest.FromString(raw)
        got = receiver.fetch(manifest, None, 600.0)
        dt = time.perf_counter() - t0
        assert len(got) == len(params)
        rates.append(n / dt / 1e9)
        print(f"  {kind}: {n / 2**30:.2f} GiB in {dt:.2f}s = {rates[-1]:.2f} GB/s (sender stage {stage_s:.2f}s)")
    ours.send("done")
    proc.join(120)
    return rates


def bench_delta(mb: int) -> None:
    from safetensors.torch import load_file, save_file

    from rlfleet.services.weight_sync.transports.disk_delta.receiver import DeltaReceiver
    from rlfleet.services.weight_sync.transports.disk_delta.sender import DeltaSender

    params = make_params(mb, 1, torch.float32)                  # fp32 master weights
    master = [torch.nn.Parameter(t) for _, t in params]
    opt = torch.optim.AdamW(master, lr=1e-6, weight_decay=0.0)
    for p in master:
        p.grad = torch.randn_like(p) * 1e-3
    before = [(k, p.detach().to(torch.bfloat16)) for (k, _), p in zip(params, master, strict=True)]
    opt.step()                                                  # one real optimizer step at lr 1e-6
    after = [(k, p.detach().to(torch.bfloat16)) for (k, _), p in zip(params, master, strict=True)]
    full = nbytes(after)
    with tempfile.TemporaryDirectory() as tmp:
        for encoding in ("xor", "overwrite"):
            root = Path(tmp) / encoding
            sender = DeltaSender(root, encoding)
            sender.stage(1, 0, before)
            t0 = time.perf_counter()
            m2 = sender.stage(2, 1, after)
            write_s = time.perf_counter() - t0
            delta_bytes = int(m2.options["file_bytes"])
            held = dict(before)
            t0 = time.perf_counter()
            def holdings(held: dict[str, torch.Tensor] = held) -> tuple[int, dict[str, torch.Tensor]]:
                return 1, held

            DeltaReceiver(holdings).fetch(m2, None, 600.0)
            apply_s = time.perf_counter() - t0
            print(f"  disk-delta {encoding}: {delta_bytes / 2**20:.2f} MiB per update = {100 * delta_bytes / full:.2f}%"
                  f" of {full / 2**30:.2f} GiB bf16; write {write_s:.2f}s; fetch+apply+verify {apply_s:.2f}s")
        path = Path(tmp) / "full.safetensors"
        save_file(dict(after), str(path))
        held = {k: t.clone() for k, t in before}
        t0 = time.perf_counter()
        for k, t in load_file(str(path)).items():      # mmap-backed: the copy is what reads the file
            held[k].copy_(t)
        full_s = time.perf_counter() - t0
        print(f"  full safetensors load of the same weights into the held tensors: {full_s:.2f}s "
              f"(delta apply / full load = {apply_s / max(full_s, 1e-9):.2f}, last encoding)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--bucket-mb", type=int, default=256)
    ap.add_argument("--versions", type=int, default=2)
    ap.add_argument("--skip", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    skip = set(args.skip.split(","))
    n = nbytes(make_params(args.mb, 0))
    print(f"memory copy of {n / 2**30:.2f} GiB: {memcpy_gbps(n):.2f} GB/s (the physical limit here)")
    for kind in ("broadcast", "nixl"):
        if kind not in skip:
            rates = bench_transport(kind, args.mb, args.bucket_mb, args.versions)
            print(f"{kind}: best {max(rates):.2f} GB/s; memory copy {memcpy_gbps(n):.2f} GB/s")
    if "delta" not in skip:
        bench_delta(args.mb)


if __name__ == "__main__":
    main()
