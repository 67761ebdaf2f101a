"""`transport: auto`: measure each available transport's bandwidth at start-up and pick one for the model's size.

Every transport pays a fixed cost per update (rendezvous round trips, notifications, file syncs) and then moves
bytes at its own rate, so the estimate is `fixed + bytes / bandwidth` and the smallest wins. NIXL's fixed cost is
the highest (per-bucket descriptors, notifications; Miles's own table has P2P slower than broadcast for small
models), broadcast needs a collective group, disk-delta moves a fraction of the bytes but pays for the diff, zstd
and two file passes. The probes are in-process loopback measurements of each data plane's copy path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

PROBE_BYTES = 32 << 20
FIXED_SECONDS = {"bucketed": 0.01, "broadcast": 0.05, "nixl": 0.25, "disk_delta": 0.2}
DELTA_FRACTION = 0.15     # disk-delta bytes per update / full bytes, conservatively (bf16 at small lr: ~1-15%)


@dataclass(frozen=True)
class Choice:
    transport: str
    reason: str
    estimates: dict[str, float]      # transport -> seconds per update
    bandwidth: dict[str, float]      # transport -> measured GB/s


def _gbps(fn: Callable[[], None], nbytes: int) -> float:
    fn()                                               # warm up
    t0 = time.perf_counter()
    fn()
    return nbytes / max(time.perf_counter() - t0, 1e-9) / 1e9


def probe_memcpy(nbytes: int = PROBE_BYTES) -> float:
    a, b = torch.empty(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    return _gbps(lambda: b.copy_(a), nbytes)


def probe_nixl(nbytes: int = PROBE_BYTES) -> float:
    from rlfleet.services.weight_sync.transports.nixl.agent import make_agent, wait_xfer

    src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.zeros(nbytes, dtype=torch.uint8)
    a, b = make_agent("probe-a"), make_agent("probe-b")
    a.register_memory([src])
    b.register_memory([dst])
    a.add_remote_agent(b.get_agent_metadata())
    remote = a.deserialize_descs(b.get_serialized_descs(b.get_xfer_descs([dst])))

    def once() -> None:
        h = a.initialize_xfer("WRITE", a.get_xfer_descs([src]), remote, b.name)
        a.transfer(h)
        if wait_xfer(a, h, time.monotonic() + 30) != "DONE":
            raise RuntimeError("NIXL probe transfer failed")
        a.release_xfer_handle(h)

    return _gbps(once, nbytes)


def probe_delta(nbytes: int = PROBE_BYTES) -> float:
    """Full-bytes-equivalent rate of xor + zstd on a tensor where ~1% changed."""
    import zstandard

    from rlfleet.services.weight_sync.transports.disk_delta.codec import encode

    prev = torch.randint(-2**15, 2**15 - 1, (nbytes // 2,), dtype=torch.int16).view(torch.bfloat16)
    new = prev.clone()
    new.view(torch.int16)[::100] += 1

    def once() -> None:
        x = encode(prev, new, "xor")["xor"]
        zstandard.ZstdCompressor(level=3).compress(x.numpy().tobytes())

    return _gbps(once, nbytes)


def choose(model_bytes: int, available: Mapping[str, Callable[[], float]]) -> Choice:
    """Measure every available transport (name -> probe returning GB/s) and pick the fastest for model_bytes."""
    bw, est = {}, {}
    for name, probe in available.items():
        try:
            bw[name] = probe()
        except Exception as exc:  # noqa: BLE001 - a transport whose probe fails is not a candidate
            log.warning("transport %s probe failed (%s): not a candidate", name, exc)
            continue
        moved = model_bytes * (DELTA_FRACTION if name == "disk_delta" else 1.0)
        est[name] = FIXED_SECONDS.get(name, 0.1) + moved / max(bw[name] * 1e9, 1.0)
    if not est:
        raise RuntimeError("no weight transport could be probed")
    best = min(est, key=est.__getitem__)
    ranked = ", ".join(f"{n} {est[n] * 1e3:.1f} ms ({bw[n]:.2f} GB/s)" for n in sorted(est, key=est.__getitem__))
    reason = (f"model {model_bytes / 2**20:.1f} MiB: estimated per-update time {ranked}; "
              f"{best} is fastest at this size")
    return Choice(best, reason, est, bw)
