"""Bucketed weight transport: stage + fetch GB/s across two processes, against a plain torch memory copy.

    python bench/weight_sync_bucketed.py [--mb 256] [--bucket-mb 64] [--chunk-kb 1024] [--versions 2]

A child process (the trainer's side) stages random float32/bfloat16 parameters and serves them; this process (a
replica) fetches each version (every tensor hash-checked). The baseline is `dst.copy_(src)` of the same number of
bytes in this process, in the same run. Prints ratios; asserts nothing.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlfleet.services.weight_sync.transports.bucketed import BucketedSender, fetch  # noqa: E402
from rlfleet.v1 import weights_pb2  # noqa: E402

TOKEN = "bench-token"


def make_params(total_mb: int, seed: int) -> list[tuple[str, torch.Tensor]]:
    """Alternating float32 [1024, 1024] (4 MiB) and bfloat16 [1024, 2048] (4 MiB) matrices, plus small vectors."""
    g = torch.Generator().manual_seed(seed)
    params: list[tuple[str, torch.Tensor]] = []
    i = 0
    while sum(t.numel() * t.element_size() for _, t in params) < total_mb << 20:
        if i % 2:
            params.append((f"layers.{i}.mlp.weight", torch.randn(1024, 2048, generator=g).to(torch.bfloat16)))
        else:
            params.append((f"layers.{i}.attn.weight", torch.randn(1024, 1024, generator=g)))
        params.append((f"layers.{i}.norm.weight", torch.randn(1024, generator=g)))
        i += 1
    return params


def serve(conn: Connection, total_mb: int, bucket_bytes: int, chunk_bytes: int, versions: int) -> None:
    """Child process: stage each version when asked, send back the manifest and the staging time."""
    torch.set_num_threads(1)
    sender = BucketedSender("127.0.0.1:0", TOKEN, bucket_bytes=bucket_bytes, chunk_bytes=chunk_bytes)
    try:
        for version in range(1, versions + 1):
            params = make_params(total_mb, seed=version)
            t0 = time.perf_counter()
            manifest = sender.stage(version, version, params)
            conn.send(time.perf_counter() - t0)
            conn.send_bytes(manifest.SerializeToString())
            conn.recv()                                   # the parent fetched it
    finally:
        sender.close()


def memcpy_seconds(nbytes: int, reps: int = 3) -> float:
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=256, help="parameter bytes per version (MiB)")
    ap.add_argument("--bucket-mb", type=float, default=64.0)
    ap.add_argument("--chunk-kb", type=int, default=1024)
    ap.add_argument("--versions", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=serve, args=(child, args.mb, int(args.bucket_mb * 2**20), args.chunk_kb * 1024,
                                           args.versions))
    proc.start()
    rows = []
    try:
        for _ in range(args.versions):
            stage_s = parent.recv()
            manifest = weights_pb2.WeightManifest.FromString(parent.recv_bytes())
            t0 = time.perf_counter()
            tensors = fetch(manifest, TOKEN, timeout=600.0, replica_id="bench")
            fetch_s = time.perf_counter() - t0
            parent.send("done")
            assert len(tensors) == len(manifest.tensors)
            rows.append((manifest.version, manifest.total_bytes, manifest.num_buckets, stage_s, fetch_s))
            del tensors
    finally:
        proc.join(60)
    copy_s = memcpy_seconds(rows[0][1])
    gbs = lambda nbytes, s: nbytes / s / 1e9
    print(f"bucketed transport, {args.mb} MiB per version, buckets of {args.bucket_mb:g} MiB, "
          f"chunks of {args.chunk_kb} KiB, torch threads 1")
    print(f"baseline torch copy_: {gbs(rows[0][1], copy_s):7.2f} GB/s ({copy_s * 1e3:.1f} ms)")
    for version, nbytes, nb, stage_s, fetch_s in rows:
        total = stage_s + fetch_s
        print(f"version {version}: {nbytes / 2**20:.0f} MiB, {nb} buckets | stage {gbs(nbytes, stage_s):6.2f} GB/s | "
              f"fetch {gbs(nbytes, fetch_s):6.2f} GB/s | stage+fetch {gbs(nbytes, total):6.2f} GB/s "
              f"({total:.2f} s) | ratio to copy_: {copy_s / total:.3f} (copy_ is {total / copy_s:.0f}x faster)")


if __name__ == "__main__":
    main()
